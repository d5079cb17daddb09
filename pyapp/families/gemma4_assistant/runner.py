"""An assistant drafter on the GPU beside its target: its buffers (DrafterState), its weights and its plans
(GpuDrafter), reading the target's K/V caches, final-normed rows and token embedding where they are.

A round of drafts after the newest token t at position p is two small writes (t into state.ids, p into the
step uniform: every step of a round is at p), one submit and one readback:

  draft_plan(row, n)       the target's final-normed row `row` into joined's second half (Runner.final_norm_at),
                           then n draft steps (model.DrafterForward); between two, the last draft's id becomes
                           the next input and its state the next second half, on the GPU; then the n ids
                           copied to a readback buffer

Plans are recorded per row and n: the default round's at load (`prepare`), others on first use.
"""

from __future__ import annotations

import struct
from array import array

from ...gpu import Device, Plan
from ...gpu import kernels as K
from ...runtime.ops import Ops
from ...runtime.requests import ReadMapped
from ...runtime.state import f32_allocator
from ...runtime.upload import model_tensor, planned_tensor
from ..family import LoadedInSteps
from .config import DrafterConfig, kv_layer
from .model import DrafterForward
from .weights import DrafterLayerWeights, DrafterWeights, bind

MAX_DRAFTS = K.HEAD_ROWS      # drafts a round at most: a token and its drafts fit one checking step


class DrafterState:
    """Every buffer a draft step reads or writes besides the weights and the target's (one token, f32).
    target_kv: the target's K/V caches by layer (its runner's state.kv; None: a count of the bytes only)."""

    def __init__(self, dev: Device, cfg: DrafterConfig, target, ctx: int, target_kv: dict | None):
        self.dev, self.cfg, self.ctx = dev, cfg, ctx
        d, H, B = cfg.hidden, cfg.n_heads, cfg.backbone_hidden
        hd = max(lc.head_dim for lc in cfg.layers)
        ff = max(lc.ffn_dim for lc in cfg.layers)
        f32 = f32_allocator(dev)
        self.step = dev.buffer(K.STEP_BYTES, "uniform", "drafter step")   # one token at the round's position
        self.ids = dev.buffer(16, label="drafter token")                  # u32: the token the step drafts after
        self.joined = f32(2 * B, "drafter joined")      # [2 B] its target embedding, then the state before it
        self.x = f32(d, "drafter x")                    # [d] residual stream
        self.x_alt = f32(d, "drafter x alt")            # [d] the stream, every other fused add (Ops)
        self.xn = f32(d, "drafter xn")                  # [d] a block's normed input
        self.q_raw = f32(H * hd, "drafter q_raw")       # [H, hd] the q projection (normed, roped by attention)
        self.q = self.q_raw
        self.attn = f32(H * hd, "drafter attn")         # [H * hd]
        self.attn_out = f32(d, "drafter attn_out")      # [d]
        self.gate = f32(ff, "drafter gate")             # [ff]
        self.up = f32(ff, "drafter up")                 # [ff]
        self.act = f32(ff, "drafter act")               # [ff] gelu(gate) * up
        self.ffn_out = f32(d, "drafter ffn_out")        # [d]
        self.y = f32(d, "drafter y")                    # [d] output_norm(x)
        self.state_out = f32(B, "drafter state")        # [B] the next step's state
        self.xq = None                                  # no chunk matmuls
        self.partials = f32(max(K.decode_partials(H, lc.head_dim, self.max_keys(lc)) for lc in cfg.layers),
                            "drafter attention partials")
        self.head_partials = None                       # sized by the head's row blocks (GpuDrafter.load)
        self.drafts = dev.buffer(4 * MAX_DRAFTS, label="drafts")                  # u32 [MAX_DRAFTS]
        self.drafts_readback = dev.buffer(4 * MAX_DRAFTS, "readback", "drafts readback")
        # each layer reads the K/V of the target's last layer of its kind that computes its own
        self.kv = ({lc.index: target_kv[kv_layer(target, lc.sliding)] for lc in cfg.layers}
                   if target_kv is not None else {})

    def max_keys(self, lc) -> int:
        """The most keys the query of this layer sees: a sliding layer's window + 1, else the context."""
        if lc.sliding and self.cfg.sliding_keys:
            return min(self.ctx, self.cfg.sliding_keys)
        return self.ctx


def _head_partials(dev: Device, token_embd) -> object:
    """The one-row head's scratch (K.head_argmax over the row blocks of the drafter's token embedding)."""
    return dev.buffer(K.head_argmax_scratch_bytes([p.rows for p in token_embd.parts]), label="drafter head partials")


def gpu_bytes(limits: dict, gguf, target_cfg, context_length: int) -> int:
    """The GPU bytes an assistant drafter takes beside a target of target_cfg in that context (GpuDrafter.load's
    buffers, counted on a MemoryCounter: nothing read), for the target's memory plan (plan_memory's beside).
    A file that is no drafter for that target is refused as GpuDrafter.load refuses it."""
    from ...runtime.memory import MemoryCounter
    cfg = DrafterConfig.from_gguf(gguf)
    cfg.check_target(target_cfg)
    bound = bind(cfg, gguf.tensors)
    counter = MemoryCounter(limits)
    planned = {t.name: planned_tensor(counter, t)[0]
               for weights in (bound, *bound.layers) for t in _tensor_fields(weights).values() if t is not None}
    DrafterState(counter, cfg, target_cfg, context_length, None)
    _head_partials(counter, planned[bound.token_embd.name])
    return counter.total


def _tensor_fields(weights) -> dict:
    """A weights dataclass's tensor fields by name (not its layers); None where a file has no such tensor."""
    return {name: t for name, t in vars(weights).items() if name != "layers"}


def _on_gpu(dev: Device, weights) -> dict:
    """Steps: each tensor field of a weights dataclass (not its layers) uploaded (None stays None)."""
    out = {}
    for name, t in _tensor_fields(weights).items():
        out[name] = (yield from model_tensor(dev, t)) if t is not None else None
    return out


class GpuDrafter(LoadedInSteps):
    """An assistant drafter loaded beside its target's runner: `open(dev, gguf, runner)` natively, `open_async`
    in the browser; `draft` (steps) drafts a round."""

    def __init__(self, dev: Device, cfg: DrafterConfig, weights: DrafterWeights, runner):
        self.dev, self.cfg, self.runner = dev, cfg, runner
        self.state = DrafterState(dev, cfg, runner.cfg, runner.ctx, runner.state.kv)
        self.state.head_partials = _head_partials(dev, weights.token_embd)
        self.model = DrafterForward(cfg, weights, self.state, runner.layout.token_embd)
        self._plans: dict = {}

    @classmethod
    def load(cls, dev: Device, gguf, runner):
        """Steps: the drafter's config checked against the runner's model, its weights onto the GPU."""
        cfg = DrafterConfig.from_gguf(gguf)
        cfg.check_target(runner.cfg)
        bound = bind(cfg, gguf.tensors)
        uploaded = yield from _on_gpu(dev, bound)
        layers = []
        for lw in bound.layers:
            layers.append(DrafterLayerWeights(**(yield from _on_gpu(dev, lw))))
        return cls(dev, cfg, DrafterWeights(**uploaded, layers=layers), runner)

    def prepare(self, n: int) -> None:
        """Record the plan of a round of n drafts after a sampled token (the one-row head's row): its shaders
        compile at load, not in the first reply."""
        self.draft_plan(None, n)

    def draft_plan(self, row: int | None, n: int, into: int | None = None) -> Plan:
        """The target's final-normed row `row` (Runner.final_norm_at) into joined's second half, then n chained
        draft steps, their ids copied to drafts_readback (or, into: to the target's step ids from that index
        on, where the step that checks them reads them and its greedy readback brings them back)."""
        key = (row, n, into)
        if key not in self._plans:
            s, width = self.state, 4 * self.cfg.backbone_hidden
            buffer, offset = self.runner.final_norm_at(row)
            plan = self.dev.plan().copy(buffer, offset, s.joined, width, width)
            for i in range(n):
                if i:
                    plan.copy(s.drafts, 4 * (i - 1), s.ids, 0, 4)
                    plan.copy(s.state_out, 0, s.joined, width, width)
                ops = Ops(self.dev, self.cfg, s, plan, 1, step=s.step, int8=self.runner.int8,
                          fuse_residual=self.runner.fuse_residual)
                self.model.step(ops, i)
                ops.finish()
            if into is None:
                plan.copy(s.drafts, 0, s.drafts_readback, 0, 4 * n)
            else:                        # read back with the checking step's greedy ids (greedy_and_step_ids)
                plan.copy(s.drafts, 0, self.runner.state.ids, 4 * into, 4 * n)
            self._plans[key] = plan
        return self._plans[key]

    def submit(self, token: int, position: int, row: int | None, n: int, into: int | None = None) -> None:
        """Start a round of n (at most MAX_DRAFTS) greedy drafts after `token` at `position`, from the target's
        final-normed row `row` of the token before it (the target's K/V of the positions before it are read);
        into: put them into the target's step ids from that index on (written before this) instead of
        drafts_readback: the checking step reads them back (read() is for a round without into)."""
        if not 1 <= n <= MAX_DRAFTS or position < 1:
            raise ValueError(f"a round drafts 1..{MAX_DRAFTS} tokens after a position past 0, not {n} at {position}")
        s = self.state
        K.write_step(self.dev, s.step, 1, position)
        self.dev.write(s.ids, array("I", [token]).tobytes())
        self.dev.submit(self.draft_plan(row, n, into))

    def read(self, n: int):
        """Step: the ids of the round submitted last (without into)."""
        data = yield ReadMapped(self.state.drafts_readback, 0, 4 * n)
        return list(struct.unpack(f"<{n}I", bytes(data)))

    def draft(self, token: int, position: int, row: int | None, n: int):
        """Steps: a round (submit) and its ids (read)."""
        self.submit(token, position, row, n)
        return (yield from self.read(n))
