"""Gemma 4's audio encoder: its log-mel features (shaders/log_mel.wgsl), the subsampling convs, the chunked local
attention with relative positions, the light convolution's GLU and causal depthwise conv, SiLU, a bias
(shaders/audio.wgsl). Its matmuls (with the clippable linears' bounds: matmul(clamp=...)), norms and residual adds
are the text model's kernels."""

from __future__ import annotations

from .. import Buffer, Device, Plan
from .shared import groups, pipeline, thread_groups, workgroup_size

MAX_WINDOW = 32           # audio.wgsl's scores array


def subsample(dev: Device, freqs_in: int, channels_in: int, channels_out: int, frames: Buffer, x: Buffer,
              weight: Buffer, norm: Buffer, y: Buffer, max_rows_in: int, eps: float = 1e-6,
              plan: Plan | None = None) -> Plan:
    """y [ceil(rows / 2), ceil(freqs_in / 2), channels_out] = relu(layer_norm(conv3x3_stride2(x)) * norm),
    x [rows, freqs_in, channels_in] with rows = frames.n_tokens; weight f32 [channels_out, channels_in, 3, 3]."""
    wg = workgroup_size(channels_out)
    if channels_out > wg:
        raise ValueError(f"a subsampling conv of {channels_out} channels: at most 256")
    p = pipeline(dev, "audio", entry="subsample",
                 constants={"FI": freqs_in, "CI": channels_in, "CO": channels_out, "EPS": eps, "WG": wg})
    bg = dev.bind_group(p, {"F": frames, "X": x, "Y": y, "Wt": weight, "NW": norm})
    cells = (max_rows_in + 1) // 2 * ((freqs_in + 1) // 2)
    return (plan or dev.plan()).dispatch(p, bg, *groups(cells))


def audio_attention(dev: Device, heads: int, head_dim: int, window: int, q_scale: float, k_scale: float, cap: float,
                    q: Buffer, k: Buffer, v: Buffer, rel: Buffer, per_dim_scale: Buffer, out: Buffer, step: Buffer,
                    max_tokens: int, plan: Plan | None = None) -> Plan:
    """out [T, heads, head_dim]: each query over itself and the window - 1 frames before it, with the
    relative positions' keys rel [window + 1, heads, head_dim] and the logit cap (audio.wgsl)."""
    if window > MAX_WINDOW:
        raise ValueError(f"an attention window of {window} frames: at most {MAX_WINDOW}")
    p = pipeline(dev, "audio", entry="attention", constants={"H": heads, "HD": head_dim, "WINDOW": window,
                                                            "QS": q_scale, "KS": k_scale, "CAP": cap})
    bg = dev.bind_group(p, {"S": step, "Q": q, "K": k, "V": v, "REL": rel, "PDS": per_dim_scale, "O": out})
    return (plan or dev.plan()).dispatch(p, bg, *thread_groups(max_tokens * heads))


def glu_depthwise(dev: Device, d: int, kernel: int, x: Buffer, weight: Buffer, out: Buffer, step: Buffer,
                  max_tokens: int, plan: Plan | None = None) -> Plan:
    """out [T, d] = causal depthwise conv (weight f32 [d, kernel]) of glu(x), x [T, 2d]."""
    p = pipeline(dev, "audio", entry="glu_depthwise", constants={"D": d, "KW": kernel})
    bg = dev.bind_group(p, {"S": step, "X": x, "Wt": weight, "O": out})
    return (plan or dev.plan()).dispatch(p, bg, *thread_groups(max_tokens * d))


def silu(dev: Device, d: int, a: Buffer, step: Buffer, max_tokens: int, plan: Plan | None = None) -> Plan:
    """a = silu(a) in place over rows of d."""
    p = pipeline(dev, "audio", entry="silu", constants={"D": d})
    bg = dev.bind_group(p, {"S": step, "A": a})
    return (plan or dev.plan()).dispatch(p, bg, *thread_groups(max_tokens * d))


def add_bias(dev: Device, d: int, a: Buffer, bias: Buffer, step: Buffer, max_tokens: int,
             plan: Plan | None = None) -> Plan:
    """a[t] += bias over rows of d."""
    p = pipeline(dev, "audio", entry="add_bias", constants={"D": d})
    bg = dev.bind_group(p, {"S": step, "A": a, "B": bias})
    return (plan or dev.plan()).dispatch(p, bg, *thread_groups(max_tokens * d))


LOG_MEL_BINS = 128        # log_mel.wgsl: a thread a mel bin


def log_mel(dev: Device, clip: Buffer, roots: Buffer, window: Buffer, filters: Buffer, mel: Buffer, clip_step: Buffer,
            max_frames: int, floor: float = 1e-3, plan: Plan | None = None) -> Plan:
    """mel [frames, 128] = log(filters @ |rfft512(window * frame)| + floor) of each 10 ms frame of the clip's
    16 kHz samples (clip_step: n_tokens the frames, pos0 the samples); roots [512] (cos, sin) of 2 pi j / 512,
    window [320], filters [128, 257]: features.py's tables (log_mel.wgsl)."""
    p = pipeline(dev, "log_mel", constants={"FLOOR": floor})
    bg = dev.bind_group(p, {"S": clip_step, "SAMP": clip, "TW": roots, "WIN": window, "FB": filters, "MEL": mel})
    return (plan or dev.plan()).dispatch(p, bg, *groups(max_frames))
