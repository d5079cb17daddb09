"""A MoE layer's router: each token's top-k experts of softmax(logits), renormalized, as a dispatch of its
own (shaders/moe_route.wgsl) or as one workgroup more of the router's matvec (RouteTail)."""

from __future__ import annotations

from dataclasses import dataclass

from .. import Buffer, Device, Plan
from .shared import pipeline, workgroup_size


@dataclass(frozen=True)
class RouteTail:
    """A MoE router's choice for one token, done by one workgroup more in a decode matvec's dispatch
    (shaders/matvec_tail_route.wgsl) instead of a dispatch of its own (moe_route): ids, weights
    [k_used] = the top-k of softmax(logits [n_experts]), renormalized."""
    n_experts: int
    k_used: int
    logits: Buffer
    ids: Buffer
    weights: Buffer


def route_workgroup(n_experts: int, k_used: int) -> int:
    """Threads of a routing workgroup (workgroup_size of the experts), once the sizes are checked."""
    if n_experts > 4096 or k_used > n_experts:
        raise ValueError(f"routing supports up to 4096 experts, k <= experts; got {n_experts}, {k_used}")
    return workgroup_size(n_experts)


def moe_route(dev: Device, n_experts: int, k_used: int, logits: Buffer, ids: Buffer, weights: Buffer,
              step: Buffer, max_tokens: int, plan: Plan | None = None) -> Plan:
    """ids/weights [T, k_used] = top-k of softmax(logits [T, n_experts]), renormalized
    (shaders/moe_route.wgsl route: one workgroup per token)."""
    p = pipeline(dev, "moe_route", entry="route",
                 constants={"E": n_experts, "KSEL": k_used, "WG": route_workgroup(n_experts, k_used)})
    bg = dev.bind_group(p, {"S": step, "IDS": ids, "WTS": weights, "LOG": logits})
    return (plan or dev.plan()).dispatch(p, bg, max_tokens)
