"""AdamW with global-norm gradient clipping on the GPU, over one flat buffer of every trainable value.

The trainer places all LoRA tensors of a run in ONE f32 GPU buffer (flat_layout: each tensor at a
64-float = 256-byte aligned offset, WebGPU's minimum storage offset alignment, zeros between them) and
their gradients in a second buffer of the same layout. An update is three dispatches
(shaders/adamw.wgsl) recorded once into the training plan and replayed; the CPU only writes a small
uniform before each submit. It computes what pyapp.train.optim's clip_grad_norm + AdamW.step compute
(tests/train/test_gpu_optim.py), in float32.

    offsets, total = flat_layout([a.size for a in tensors])
    opt = GpuAdamW(dev, total, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    opt.record(plan, params, grads)            # after the backward in the step's plan
    for step in range(steps):
        opt.prepare(step, sched.lr(step), max_norm=1.0)
        dev.submit(plan)
    norm, factor = opt.read_norm()             # or copy opt.norm_buffer into a readback buffer
    m, v, t = opt.state_bytes()                # checkpoints: unflatten(m, sizes) gives the per-tensor arrays

A non-finite gradient norm skips the update (parameters and moments unchanged; the norm readback shows
it). Standard library only: it runs in Pyodide.
"""

from __future__ import annotations

from array import array

from ..gpu import Buffer, Device, GPUError, Plan
from ..gpu import kernels as K

FLAT_ALIGN = 64          # floats: 256 bytes, WebGPU's minStorageBufferOffsetAlignment


def _align(n: int) -> int:
    return -(-n // FLAT_ALIGN) * FLAT_ALIGN


def flat_layout(sizes: list[int]) -> tuple[list[int], int]:
    """(offset of each tensor in floats, total floats) of tensors of these sizes placed one after the
    other in a flat buffer, each starting at a multiple of FLAT_ALIGN; the total is rounded up to one too."""
    offsets, end = [], 0
    for i, n in enumerate(sizes):
        if n < 1:
            raise ValueError(f"tensor {i} of the flat layout has {n} values")
        offsets.append(_align(end))
        end = offsets[-1] + n
    return offsets, _align(end)


def flatten(tensors: list) -> bytes:
    """The f32 bytes of a flat buffer holding these tensors (array('f') or anything array('f', .) takes)
    at their flat_layout offsets, zero padding between them."""
    tensors = [t if isinstance(t, array) and t.typecode == "f" else array("f", t) for t in tensors]
    offsets, total = flat_layout([len(t) for t in tensors])
    out = bytearray(4 * total)
    for off, t in zip(offsets, tensors):
        out[4 * off:4 * (off + len(t))] = t.tobytes()
    return bytes(out)


def unflatten(data: bytes, sizes: list[int]) -> list[array]:
    """The tensors (array('f')) of a flat buffer's bytes laid out by flat_layout(sizes)."""
    offsets, total = flat_layout(sizes)
    if len(data) < 4 * total:
        raise ValueError(f"a flat buffer of {len(data)} bytes is shorter than the layout's {4 * total}")
    out = []
    for off, n in zip(offsets, sizes):
        a = array("f")
        a.frombytes(bytes(data[4 * off:4 * (off + n)]))
        out.append(a)
    return out


class GpuAdamW:
    """torch.optim.AdamW + clip_grad_norm_ over a flat f32 parameter buffer of n_floats values; owns the
    moments m and v, the partial sums, the norm readback and the per-update parameters."""

    def __init__(self, dev: Device, n_floats: int, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        if n_floats < 1:
            raise ValueError(f"nothing to optimize: {n_floats} floats")
        limit = dev.limits.get("max_storage_buffer_binding_size")
        if limit is not None and 4 * n_floats > limit:
            raise GPUError(f"{n_floats} trainable floats ({4 * n_floats} bytes) exceed the device's "
                           f"maxStorageBufferBindingSize ({limit}): lower the rank or the targets")
        self.dev, self.n = dev, n_floats
        self.betas, self.eps, self.weight_decay = tuple(betas), eps, weight_decay
        self.m = dev.buffer(4 * n_floats, label="adamw m")
        self.v = dev.buffer(4 * n_floats, label="adamw v")
        self.partials = dev.buffer(4 * K.adamw_partials(n_floats), label="adamw partials")
        self.norm_buffer = dev.buffer(8, label="adamw norm")     # f32 [2]: norm before clipping, factor
        self.uniform = dev.buffer(K.OPT_PARAMS_BYTES, "uniform", label="adamw settings")
        self.t = 0                                                # updates prepared (optim.AdamW.t)

    def record(self, plan: Plan, params: Buffer, grads: Buffer, zero_grads: bool = False) -> Plan:
        """Append one update of params with grads (flat buffers of at least n_floats floats) to plan.
        zero_grads: the update also clears grads, ready for the next step's accumulation."""
        for name, b in (("parameter", params), ("gradient", grads)):
            if b.size < 4 * self.n:
                raise ValueError(f"the {name} buffer holds {b.size // 4} floats, the optimizer {self.n}")
        return K.adamw(self.dev, self.n, params, grads, self.m, self.v, self.partials, self.norm_buffer,
                       self.uniform, zero_grads=zero_grads, plan=plan)

    def prepare(self, step_index: int, lr: float, max_norm: float | None, grad_scale: float = 1.0) -> None:
        """Write the parameters of update step_index (0-based; bias corrections use t = step_index + 1)
        before the plan holding it is submitted. max_norm None or <= 0: no clipping. grad_scale multiplies
        the gradients first (1 / micro-batches when they were summed over micro-batches); the norm is theirs."""
        self.t = step_index + 1
        self.dev.write(self.uniform, K.pack_opt_params(self.t, lr, max_norm, self.betas, self.eps,
                                                      self.weight_decay, grad_scale))

    def read_norm(self) -> tuple[float, float]:
        """(gradient norm before clipping, clip factor; 0 = update skipped) of the latest update (native)."""
        return tuple(array("f", self.dev.read(self.norm_buffer, 0, 8)))

    def state_bytes(self) -> tuple[bytes, bytes, int]:
        """(m, v, t) for a checkpoint: both moments' flat f32 bytes (native; in the browser use
        state_bytes_async) and the update count."""
        return self.dev.read(self.m, 0, 4 * self.n), self.dev.read(self.v, 0, 4 * self.n), self.t

    async def state_bytes_async(self) -> tuple[bytes, bytes, int]:
        m = await self.dev.read_async(self.m, 0, 4 * self.n)
        return m, await self.dev.read_async(self.v, 0, 4 * self.n), self.t

    def load_state(self, m_bytes: bytes, v_bytes: bytes, t: int) -> None:
        """Restore the moments (flat f32 bytes, as state_bytes gives) and the update count."""
        for name, b in (("m", m_bytes), ("v", v_bytes)):
            if len(b) != 4 * self.n:
                raise ValueError(f"checkpoint {name} has {len(b)} bytes, the optimizer {4 * self.n}")
        self.dev.write(self.m, m_bytes)
        self.dev.write(self.v, v_bytes)
        self.t = int(t)
