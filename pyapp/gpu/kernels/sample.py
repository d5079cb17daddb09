"""Sampling on the GPU (shaders/sample.wgsl): argmax, and temperature / top-k / top-p / min-p with the
repeat penalty, in one or two stages by vocabulary size. The parameters' layout is SampleParams (shared.py)."""

from __future__ import annotations

from .. import Buffer, Device, Plan
from .shared import SAMPLE_MAX_K, SAMPLE_SLICE, pipeline


def argmax(dev: Device, v: int, logits: Buffer, out: Buffer, plan: Plan | None = None) -> Plan:
    """out[0] = argmax(logits[:v]) as u32."""
    p = pipeline(dev, "sample", entry="argmax", constants={"V": v})
    return (plan or dev.plan()).dispatch(p, dev.bind_group(p, {"L": logits, "OUT": out}), 1)


def sample_scratch_bytes(v: int) -> int:
    """Bytes of candidate scratch `sample` needs for a vocabulary of v (0: single stage)."""
    nw = -(-v // SAMPLE_SLICE)
    return 0 if nw <= 1 else nw * SAMPLE_MAX_K * 8 + nw * 4


def sample(dev: Device, v: int, logits: Buffer, out: Buffer, params: Buffer, scratch: Buffer | None = None,
           plan: Plan | None = None) -> Plan:
    """out[0] = token sampled from logits[:v] (modified in place by the repeat penalty).

    params: storage buffer laid out as SampleParams (see pack_sample_params).
    scratch (sample_scratch_bytes(v)): candidates of the first stage; big vocabularies are
    cut into SAMPLE_SLICE-logit slices whose top k are found in parallel, then merged."""
    plan = plan or dev.plan()
    nw = -(-v // SAMPLE_SLICE)
    if nw <= 1:   # one workgroup does it all; the candidate bindings are declared but unused
        p = pipeline(dev, "sample", entry="sample", constants={"V": v})
        unused = {name: dev.buffer(16, label="unused") for name in ("CV", "CI", "CNT")}
        return plan.dispatch(p, dev.bind_group(p, {"OUT": out, "SP": params, "LW": logits, **unused}), 1)
    if scratch is None or scratch.size < sample_scratch_bytes(v):
        raise ValueError(f"sampling over {v} logits needs {sample_scratch_bytes(v)} bytes of scratch")
    n = nw * SAMPLE_MAX_K * 4     # bytes of candidate values, then as many of ids, then the counts
    res = {"SP": params, "LW": logits, "CV": (scratch, 0, n), "CI": (scratch, n, n), "CNT": (scratch, 2 * n, nw * 4)}
    consts = {"V": v, "NW": nw}
    p = pipeline(dev, "sample", entry="topk_local", constants=consts)
    plan.dispatch(p, dev.bind_group(p, res), nw)
    p = pipeline(dev, "sample", entry="sample", constants={**consts, "STAGED": True})
    return plan.dispatch(p, dev.bind_group(p, {"OUT": out, **res}), 1)
