"""The native device and what every kernel shares: bindings by the shader's variable names, no loss or error
reported, the shared uniform layouts (the step, the sampler's parameters) packed as the shaders read them, uploads
in chunks and the buffer size limit."""

from __future__ import annotations

import numpy as np
import pytest

from pyapp.gpu import GPUError
from pyapp.gpu import kernels as K

pytestmark = pytest.mark.gpu


def test_bindings_are_named_by_the_shader(dev):
    from pyapp.gpu import binding_numbers
    src = """// @group(0) @binding(7) var<storage, read> OLD: array<f32>;
    @group(0) @binding(2) var<storage, read_write> Y: array<f32>;
    @binding(3) @group(0)
    var<uniform> S: Step;
    @group(1) @binding(0) var<storage, read> OTHER: array<u32>;
    var<workgroup> red: array<f32, 64>;"""
    assert binding_numbers(src) == {"Y": 2, "S": 3}
    p = dev.pipeline("rope", prelude=K.SHARED_WGSL, constants={"H": 1, "HD": 4, "NROT": 4})
    assert p.bindings == {"X": 0, "FF": 1, "S": 2}
    with pytest.raises(GPUError, match=r"rope:main has no binding named 'Y' \(it declares FF, S, X\)"):
        dev.bind_group(p, {"X": dev.dummy, "Y": dev.dummy})


def test_native_device_reports_no_loss_or_error(dev):
    assert dev.lost_reason is None and dev.last_error is None
    dev.clear_error()


def test_cpu_adapters_are_told_from_gpus(dev):
    """software_adapter names a CPU adapter from its info (Chrome's SwiftShader, Mesa's llvmpipe, the browser's
    fallback flag) and nothing for a GPU; Device.cpu_adapter follows it (the tests' lavapipe is one)."""
    from pyapp.gpu import software_adapter
    assert software_adapter({"vendor": "google", "architecture": "swiftshader", "fallback": False}) == "SwiftShader"
    assert software_adapter({"vendor": "llvmpipe", "device": "llvmpipe (LLVM 15.0.6, 256 bits)"}) == "llvmpipe"
    assert software_adapter({"vendor": "", "architecture": "", "fallback": True}) == "the browser's fallback adapter"
    assert software_adapter({"vendor": "nvidia", "architecture": "hopper", "fallback": False}) is None
    assert dev.cpu_adapter == (software_adapter(dev.info) is not None)


def test_shared_layouts_pack_as_the_shaders_read_them():
    import struct
    assert K.pack_step(7, 123) == struct.pack("<4I", 7, 123, 0, 0) and K.STEP_BYTES == 16
    assert "struct Step {\n    n_tokens: u32,\n    pos0: u32," in K.SHARED_WGSL
    got = K.pack_sample_params(0.7, 40, 0.9, 0.05, 1.1, range(100), 0.25)
    recent = list(range(100))[-K.MAX_RECENT:]
    assert got == struct.pack("<5f3I", 0.7, 0.9, 0.05, 0.25, 1.1, 40, K.MAX_RECENT, 0) + struct.pack("<64I", *recent)
    assert len(got) == K.SAMPLE_PARAMS_BYTES == 32 + 4 * K.MAX_RECENT


def test_upload_chunks_copy_and_limits(dev):
    from pyapp.source import BytesSource
    data = np.arange(1001, dtype=np.uint8).tobytes() * 3        # odd length: padded to 4 bytes
    a = dev.buffer(len(data))
    dev.upload(a, BytesSource(b"xx" + data), 2, len(data), chunk=100)
    assert dev.read(a, 0, len(data)) == data
    b = dev.buffer(64)
    dev.submit(dev.plan().copy(a, 8, b, 4, 32))
    assert dev.read(b, 4, 32) == data[8:40]
    with pytest.raises(GPUError, match="maxBufferSize"):
        dev.buffer(dev.limits["max_buffer_size"] + 1)


def test_peak_probe_runs_the_chains_it_counts(dev):
    """bench/peak_probe.py's DP4A and FMA probes (the ceilings the prefill kernels are read against) compute
    what they count: each thread's summed accumulators after 3 steps equal a numpy replay of its chains, so
    the compiler kept every step. Also a pipeline made from source (Device.pipeline_from_source)."""
    import asyncio
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import peak_probe
    iters, workgroups = 3, 1
    rows = asyncio.run(peak_probe.probe_async(dev, iters=iters, workgroups=workgroups, repeat=1))
    assert [r["probe"] for r in rows] == [name for name, _, _ in peak_probe.PROBES]
    assert all(r["tera_ops_s"] >= 0 and r["us"] > 0 for r in rows)
    threads = peak_probe.WORKGROUP * workgroups
    chains = peak_probe.CHAINS // 4
    # the probes leave the last one's (FMA's) sums in a buffer of their own; run the DP4A one again to read it
    src = peak_probe._DP4A.replace("WG", str(peak_probe.WORKGROUP)).replace("CH", str(chains))
    p = dev.pipeline_from_source(src, "dp4a replay", constants={"ITERS": iters})
    y = dev.buffer(16 * threads)
    plan = dev.plan().dispatch(p, dev.bind_group(p, {"Y": y}), workgroups)
    dev.submit(plan)
    got = np.frombuffer(dev.read(y), np.int32).reshape(threads, 4)
    g = np.arange(threads, dtype=np.int64)
    b = (0x01fe03fd ^ g).astype(np.uint32).view(np.uint8).reshape(threads, 4).view(np.int8).astype(np.int64)
    total = np.zeros((threads, 4), np.int64)
    for c in range(chains):
        acc = np.stack([g + c, np.full(threads, c), g, np.full(threads, 7)], 1).astype(np.int32)
        for _ in range(iters):
            a = acc.view(np.uint32).view(np.uint8).reshape(threads, 4, 4).view(np.int8).astype(np.int64)
            acc = (acc.astype(np.int64) + (a * b[:, None, :]).sum(-1)).astype(np.int32)
        total += acc
    np.testing.assert_array_equal(got, total.astype(np.int32))
