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
