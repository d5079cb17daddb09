"""The memory plan: what lives on the GPU and what stays in the file, decided before a byte moves.

WebGPU tells a page nothing about how much memory the GPU has, so the budget is
the user's (`--gpu-memory MIB`, the app's setting); without one, everything is
resident, as fast as it gets, and a GPU too small for that reports running out
of memory. Within a budget, in order:

  1. resident always: attention, norms, dense MLP, router, embeddings and head,
     the activations and the KV cache for the chosen context, and an assistant drafter
     chosen to load beside the model (`beside`: its weights and buffers);
  2. the per-layer embedding table (E2B/E4B): resident if it fits, else read a
     row per token from the file (pyapp.runtime.state);
  3. experts (26B-A4B): all resident if they fit, else a cache of `slots`
     experts per MoE layer, filled from the file per step (pyapp.runtime.experts).
     A token needs `n_experts_used` experts per layer at once: that many slots
     is the minimum. `--expert-cache MIB` sets the cache size directly.

The byte counts are exact: the upload planner and the State allocate against a
counting device (`MemoryCounter`), so padding and fusions are counted as loaded.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import Fault, Gemma4Error
from ..gpu import Device
from .state import State
from .upload import layer_experts, plan_uploads

MIB = 1 << 20
# What one expert read costs when no load has been measured yet: a typical NVMe SSD, or a
# file in the OS page cache read through the browser's File API (both measured in GB/s).
ASSUMED_READ_BYTES_PER_S = 2e9


def size(n: float) -> str:
    """Bytes for people: 16.9 GiB, 812 MiB, 0.38 MiB."""
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    return f"{n / MIB:,.0f} MiB" if n >= 10 * MIB else f"{n / MIB:.2g} MiB"


class PlanError(Gemma4Error, ValueError):
    """The model cannot run within the GPU memory budget."""


class MemoryCounter(Device):
    """A device that allocates nothing and adds up the bytes of the buffers asked of it."""

    backend = "count"

    def __init__(self, limits: dict):
        super().__init__()
        self.limits = dict(limits)
        self.total = 0
        self.largest = 0         # the largest buffer since it was last set to 0

    def _create_buffer(self, size, kind, label):
        self.total += size
        self.largest = max(self.largest, size)

    def _write(self, buf, offset, data):
        pass


@dataclass
class MemoryPlan:
    weights: int              # resident weight bytes (experts not included)
    state: int                # activations + KV cache + sampling buffers
    ple_table: int            # the per-layer embedding table (0: none)
    ple_in_file: bool         # that table stays in the file
    experts: int              # every expert of every MoE layer
    expert_each: int          # one expert of every MoE layer: what a cache slot costs
    n_experts: int
    n_used: int
    slots: int | None         # experts held per MoE layer when they stream; None: all resident
    budget: int | None        # bytes, or None (no budget: everything resident)
    context_length: int       # the KV cache's positions, counted in state
    prompt_step: int          # the most tokens a prompt step takes, their activations counted in state
    largest_state_buffer: int = 0   # bytes of the largest of state's buffers (each is bound whole)
    beside: int = 0           # what is loaded beside the model within the budget (an assistant drafter)

    @property
    def streams(self) -> bool:
        return self.slots is not None

    @property
    def expert_cache(self) -> int:
        return self.slots * self.expert_each if self.streams else 0

    @property
    def total(self) -> int:
        resident_ple = 0 if self.ple_in_file else self.ple_table
        return (self.weights + resident_ple + self.state + (self.expert_cache if self.streams else self.experts)
                + self.beside)

    @property
    def minimum(self) -> int:
        """The least GPU memory this model and context can run in (PLE in the file, fewest experts)."""
        return self.weights + self.state + self.n_used * self.expert_each + self.beside

    @property
    def read_per_token(self) -> float:
        """Expected file bytes per decoded token: each chosen expert misses the cache with
        probability 1 - slots / E under uniform routing (random weights route close to uniformly:
        the worst case; real models reuse experts more)."""
        if not self.streams:
            return 0.0
        return self.n_used * self.expert_each * (1 - self.slots / self.n_experts)

    def tokens_per_s_bound(self, read_bytes_per_s: float = ASSUMED_READ_BYTES_PER_S) -> float | None:
        """Decode tokens/s the file reads alone allow (None: nothing streams)."""
        return read_bytes_per_s / self.read_per_token if self.read_per_token else None

    def describe(self, read_bytes_per_s: float | None = None) -> list[str]:
        """Plain lines for the CLI and the app; read_bytes_per_s: the file's measured read rate."""
        rate_source = "measured while loading" if read_bytes_per_s else "assumed"
        read_bytes_per_s = read_bytes_per_s or ASSUMED_READ_BYTES_PER_S
        budget = (f" of a {size(self.budget)} budget" if self.budget else
                  " (expert cache set directly)" if self.streams else " (no budget set: everything resident)")
        lines = [f"GPU memory: {size(self.total)}{budget}",
                 f"  resident weights {size(self.weights + (0 if self.ple_in_file else self.ple_table))}, "
                 f"activations and KV cache {size(self.state)} (prompt steps of up to {self.prompt_step} tokens)"]
        if self.beside:
            lines.append(f"  assistant drafter {size(self.beside)}")
        if self.ple_table:
            lines.append(f"  per-layer embeddings: {'read per token from the file' if self.ple_in_file else 'resident'}"
                         f" ({size(self.ple_table)})")
        if self.experts and not self.streams:
            lines.append(f"  experts: all {self.n_experts} per layer resident ({size(self.experts)})")
        elif self.streams:
            bound = self.tokens_per_s_bound(read_bytes_per_s)
            lines.append(f"  experts: {self.slots} of {self.n_experts} per layer cached on the GPU "
                         f"({size(self.expert_cache)}), the rest read from the file as the router picks them")
            lines.append(f"  expected reads: {size(self.read_per_token)} per token with uniform routing, "
                         f"at most {bound:.1f} tokens/s at {read_bytes_per_s / 1e9:.1f} GB/s ({rate_source})")
        return lines


def plan_memory(limits: dict, cfg, bound, context_length: int, chunk: int, gpu_memory: int | None = None,
                expert_cache: int | None = None, ple_in_file: bool | None = None, state_class=State,
                beside: int = 0, int8: bool = True) -> MemoryPlan:
    """The plan for this model and context under a budget (bytes; None: no budget).
    expert_cache (bytes): the experts' cache size, overriding what the budget leaves them.
    ple_in_file: force the per-layer embedding table's place (None: resident if it fits).
    state_class: the buffers the runner allocates (its state_class: a family's may hold more).
    beside (bytes): loaded beside the model within the same budget (an assistant drafter: its gpu_bytes).
    int8: whether the runner's steps take int8 activations (their codes and slices' partial sums counted)."""
    experts = [t for lc in cfg.layers if lc.has_moe for t in layer_experts(bound, lc)]
    streamable = bool(experts)
    counter = MemoryCounter(limits)
    layout, _ = plan_uploads(counter, cfg, bound, ple_in_file=True, expert_slots=0 if streamable else None)
    weights = counter.total
    counter.largest = 0
    state_class(counter, cfg, layout, context_length, chunk, int8=int8)
    state = counter.total - weights
    # the PLE table's rows buffer (PLE in the file) is counted in state: a few KiB
    ple_table = bound.ple_token_embd.nbytes if bound.ple_token_embd is not None else 0
    E = cfg.n_experts
    plan = MemoryPlan(weights=weights, state=state, ple_table=ple_table, ple_in_file=bool(ple_in_file),
                      experts=sum(t.nbytes for t in experts), expert_each=sum(t.nbytes // E for t in experts),
                      n_experts=E, n_used=cfg.n_experts_used, slots=None, budget=gpu_memory,
                      context_length=context_length, prompt_step=chunk, largest_state_buffer=counter.largest,
                      beside=beside)

    if expert_cache is not None:
        if not streamable:
            raise PlanError("--expert-cache applies to mixture-of-experts models; this one has no experts")
        plan.slots = min(E, expert_cache // plan.expert_each)
        if plan.slots < plan.n_used:
            raise PlanError(f"an expert cache of {size(expert_cache)} holds {plan.slots} experts per layer; "
                            f"a token needs {plan.n_used} ({size(plan.n_used * plan.expert_each)})")
        if plan.slots == E:
            plan.slots = None        # it holds them all: nothing to stream
    if gpu_memory is None:
        return plan
    if gpu_memory < plan.minimum:
        raise PlanError(_too_small(plan, plan.minimum, gpu_memory, context_length), fault=Fault.TOO_SMALL,
                        need=size(plan.minimum))
    if ple_in_file is None and ple_table:
        plan.ple_in_file = plan.minimum + ple_table > gpu_memory
    if expert_cache is None and streamable:
        left = gpu_memory - (plan.total - plan.experts)        # what the experts can have
        if left < plan.experts:
            plan.slots = min(E, left // plan.expert_each)
    if plan.total > gpu_memory:
        raise PlanError(_too_small(plan, plan.total, gpu_memory, context_length), fault=Fault.TOO_SMALL,
                        need=size(plan.total))
    return plan


def _too_small(plan: MemoryPlan, need: int, budget: int, context_length: int) -> str:
    parts = [f"weights {size(plan.weights)}", f"activations and a {context_length}-token KV cache {size(plan.state)}"]
    if plan.beside:
        parts.append(f"the assistant drafter {size(plan.beside)}")
    if plan.expert_each:
        parts.append(f"{plan.n_used} experts per layer {size(plan.n_used * plan.expert_each)}" if need == plan.minimum
                     else f"experts {size(plan.expert_cache or plan.experts)}")
    return (f"this model needs at least {size(need)} of GPU memory ({', '.join(parts)}); the budget is "
            f"{size(budget)}. Raise the GPU memory budget, or shorten the context.")
