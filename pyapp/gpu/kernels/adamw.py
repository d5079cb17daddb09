"""The training optimizer on the GPU (shaders/adamw.wgsl): AdamW + global-norm clipping over one flat
buffer, mirroring pyapp.train.optim (tests/train/test_gpu_optim.py)."""

from __future__ import annotations

import math

from .. import Buffer, Device, Plan
from .shared import groups, pipeline, struct_layout, thread_groups, wgsl_struct

OPT_PARAM_FIELDS = (("step_size", "f32"), ("root_c2", "f32"), ("decay", "f32"), ("max_norm", "f32"),
                    ("b1", "f32"), ("one_minus_b1", "f32"), ("b2", "f32"), ("one_minus_b2", "f32"),
                    ("eps", "f32"), ("grad_scale", "f32"), ("_pad0", "f32"), ("_pad1", "f32"))
_OPT_PARAMS = struct_layout(OPT_PARAM_FIELDS)
OPT_PARAMS_BYTES = _OPT_PARAMS.size
_OPT_PRELUDE = wgsl_struct("OptParams", OPT_PARAM_FIELDS)
ADAMW_MAX_PARTIALS = 1024         # sumsq workgroups at most: the norm pass reduces them in one workgroup
_ADAMW_PER_THREAD = 16            # elements a sumsq thread sums before partials grow past 1 (small buffers)
_ADAMW_WG = 256
_ADAMW_BINDINGS = {"sumsq": ("G", "PART"), "norm": ("PART", "NORM", "OP"),
                   "update": ("P", "G", "M", "V", "NORM", "OP")}


def pack_opt_params(t: int, lr: float, max_norm: float | None, betas=(0.9, 0.999), eps: float = 1e-8,
                    weight_decay: float = 0.0, grad_scale: float = 1.0) -> bytes:
    """Bytes of shaders/adamw.wgsl's OptParams for update number t (1-based, as optim.AdamW.t after
    the step), computed in double precision as optim.AdamW.step does; max_norm None or <= 0: no clipping.
    grad_scale multiplies the gradients before everything (1 / micro-batches for summed accumulations)."""
    if t < 1:
        raise ValueError(f"the update count starts at 1, got {t}")
    if not grad_scale > 0:
        raise ValueError(f"grad_scale must be positive, got {grad_scale}")
    b1, b2 = betas
    return _OPT_PARAMS.pack(lr / (1.0 - b1 ** t), math.sqrt(1.0 - b2 ** t), 1.0 - lr * weight_decay,
                            max_norm if max_norm and max_norm > 0 else 0.0,
                            b1, 1.0 - b1, b2, 1.0 - b2, eps, grad_scale, 0.0, 0.0)


def adamw_partials(n: int) -> int:
    """Partial sums (sumsq workgroups) for a flat buffer of n floats."""
    return max(1, min(ADAMW_MAX_PARTIALS, -(-n // (_ADAMW_WG * _ADAMW_PER_THREAD))))


def adamw(dev: Device, n: int, params: Buffer, grads: Buffer, m: Buffer, v: Buffer, partials: Buffer,
          norm: Buffer, opt_params: Buffer, zero_grads: bool = False, plan: Plan | None = None) -> Plan:
    """One AdamW update of the flat buffer params [n] with grads [n] clipped to a global norm, as three
    dispatches (sumsq, norm, update): m, v [n] the moments, partials [adamw_partials(n)] scratch, norm [2]
    = (the norm before clipping, the factor), opt_params the uniform written by pack_opt_params before
    each submit. zero_grads: the update also clears grads (ready for the next accumulation)."""
    parts = adamw_partials(n)
    plan = plan or dev.plan()
    c = {"N": n, "NP": parts, "WG": _ADAMW_WG}
    res = {name: (buf, 0, 4 * floats) for name, buf, floats in (     # bind exactly the floats used
        ("P", params, n), ("G", grads, n), ("M", m, n), ("V", v, n), ("PART", partials, parts), ("NORM", norm, 2),
        ("OP", opt_params, OPT_PARAMS_BYTES // 4))}
    for entry, dispatch in (("sumsq", groups(parts)), ("norm", (1, 1)), ("update", thread_groups(n, _ADAMW_WG))):
        p = pipeline(dev, "adamw", entry=entry, prelude=_OPT_PRELUDE,
                     constants=dict(c, ZERO_GRADS=zero_grads) if entry == "update" else c)
        plan.dispatch(p, dev.bind_group(p, {name: res[name] for name in _ADAMW_BINDINGS[entry]}), *dispatch)
    return plan
