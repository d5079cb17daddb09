"""Browser backend: navigator.gpu through Pyodide's JS FFI (runs only in Pyodide).

FFI crossings are the cost here, so the per-token paths live in a small JS
helper (web/gpu.js, which web/worker.js registers as the module `webgpu_helper`):
a Plan is turned into one JS array once, and every submit is a single call that
encodes all dispatches and submits them. Tensor bytes from a
Blob/File go Blob.slice -> ArrayBuffer -> writeBuffer inside JS, never through
Python's heap; Python bytes are written through a zero-copy view of wasm memory.
"""

from __future__ import annotations

import asyncio

import js  # type: ignore[import-not-found]
from pyodide.ffi import to_js  # type: ignore[import-not-found]

from . import LIMIT_NAMES, UPLOAD_CHUNK, Device, GPUError, Plan

PROGRESS_S = 0.25    # how often programs_ready_async reports

# camelCase names of LIMIT_NAMES
_JS_LIMITS = {n: n.split("_")[0] + "".join(w.capitalize() for w in n.split("_")[1:]) for n in LIMIT_NAMES}


def _obj(d: dict):
    return to_js(d, dict_converter=js.Object.fromEntries)


def _constants(d: dict):
    """Pipeline override constants: WebGPU takes numbers (Dawn's Node binding rejects booleans)."""
    return _obj({k: (int(v) if isinstance(v, bool) else v) for k, v in d.items()})


class BrowserDevice(Device):
    backend = "browser"
    int8_block_units = True

    @classmethod
    async def create(cls) -> "BrowserDevice":
        import webgpu_helper  # type: ignore[import-not-found]  # web/gpu.js
        helper = webgpu_helper.createHelper()
        try:
            r = await helper.init(_obj({"features": ["shader-f16", "subgroups", "timestamp-query"],
                                        "limits": list(_JS_LIMITS.values())}))
        except Exception as e:  # JsException: no WebGPU, no adapter, device refused
            raise GPUError(str(e)) from e
        return cls(helper, r)

    def __init__(self, helper, r):
        super().__init__()
        self.js = helper
        self.device = r.device
        self._state = r.state
        self.features = set(r.features.to_py())
        lim = r.limits.to_py()
        self.limits = {n: int(lim[c]) for n, c in _JS_LIMITS.items() if lim.get(c) is not None}
        self.info = r.info.to_py()
        self._staging_views = {}                    # the helper's staging array's first n bytes, a proxy a size
        self._staged_max = int(helper.staging.length)   # writes up to this size go through it (web/gpu.js writeStaged)
        self._programs_waited = 0                       # pipelines made before the last programs_ready_async

    def _check(self):
        if self.lost_reason is not None:
            raise GPUError(f"the GPU device was lost ({self.lost_reason}); reload the page")

    @property
    def lost_reason(self) -> str | None:
        return self._state.lost          # set by device.lost's promise

    @property
    def last_error(self) -> str | None:
        return self._state.error         # set by onuncapturederror

    def clear_error(self) -> None:
        self._state.error = None         # None -> undefined in JS, read back as None

    def _create_buffer(self, size, kind, label):
        self._check()
        return self.js.buffer(self.device, size, kind, label)

    def _write(self, buf, offset, data):
        n = len(data)
        if n > self._staged_max:
            self.js.write(self.device, buf.handle, offset, data)
            return
        view = self._staging_views.get(n)
        if view is None:
            view = self._staging_views[n] = self.js.staging.subarray(0, n)
        view.assign(data)
        self.js.writeStaged(self.device, buf.handle, offset, n)

    async def upload_async(self, buf, source, src_offset, n, dst_offset=0, chunk=UPLOAD_CHUNK):
        """A source with a JS `blob` (File/Blob) is copied in JS; others go through Python."""
        blob = getattr(source, "blob", None)
        if blob is None:
            return await super().upload_async(buf, source, src_offset, n, dst_offset, chunk)
        self._check()
        if dst_offset % 4:
            raise GPUError(f"buffer writes need 4-byte aligned offsets, got {dst_offset}")
        try:
            await self.js.uploadBlob(self.device, buf.handle, dst_offset, blob, src_offset, n, chunk & ~3)
        except Exception as e:
            raise GPUError(f"reading the model file failed at byte {src_offset}: {e}") from e

    async def upload_many_async(self, source, copies, chunk=UPLOAD_CHUNK):
        """Every copy's file reads started at once in JS (a round of streamed experts: a few MB each)."""
        blob = getattr(source, "blob", None)
        if blob is None:
            return await super().upload_many_async(source, copies)
        self._check()
        flat = []
        for buf, src_offset, n, dst_offset in copies:
            if dst_offset % 4:
                raise GPUError(f"buffer writes need 4-byte aligned offsets, got {dst_offset}")
            flat += [buf.handle, dst_offset, src_offset, n]
        try:
            await self.js.uploadBlobs(self.device, blob, to_js(flat), chunk & ~3)
        except Exception as e:
            raise GPUError(f"reading the model file failed: {e}") from e

    def _create_pipeline(self, source, entry, constants, label):
        self._check()
        return self.js.pipeline(self.device, source, entry, _constants(constants), label)

    async def programs_ready_async(self, progress=None, cancelled=None):
        """Wait for the GPU process to compile the pipelines made so far (web/gpu.js programs), calling
        progress(compiled, made) about every PROGRESS_S while it does, counting those made since the last wait
        (a second model's load counts its own); returns early once cancelled()."""
        self._check()
        ready = asyncio.ensure_future(self.js.programsReady(self.device))
        programs, before = self.js.programs, self._programs_waited
        while not ready.done():
            if cancelled and cancelled():
                return
            if progress:
                progress(int(programs.done) - before, int(programs.made) - before)
            await asyncio.wait([ready], timeout=PROGRESS_S)
        await ready
        self._programs_waited = int(programs.made)
        self._check()

    def _create_bind_group(self, pipeline, entries):
        flat = []
        for i, b, off, size in entries:
            flat += [i, b.handle, off, size]
        return self.js.bindGroup(self.device, pipeline.handle, to_js(flat))

    def _js_ops(self, plan: Plan):
        if plan._native is None:  # built once per plan; replays cost one FFI call
            ops = []
            for op in plan.ops:
                if op[0] == "d":
                    _, p, bg, x, y, z, indirect = op
                    if indirect is None:
                        ops.append([0, p.handle, bg.handle, x, y, z])
                    else:
                        ops.append([2, p.handle, bg.handle, indirect[0].handle, indirect[1]])
                else:
                    _, src, so, dst, do, n = op
                    ops.append([1, src.handle, so, dst.handle, do, n])
            plan._native = to_js(ops)
        return plan._native

    def _submit(self, plan: Plan):
        self._check()
        self.js.submit(self.device, self._js_ops(plan))

    async def time_plan_gpu_async(self, plan, repeat=5, per_dispatch=False):
        if "timestamp-query" not in self.features:
            raise GPUError("this device has no timestamp queries")
        self._check()
        r = await self.js.timePlan(self.device, self._js_ops(plan), repeat, per_dispatch)
        return {"cpu_ms": list(r.cpu.to_py()), "ns": [int(v) for v in r.ns.to_py()]}

    async def read_mapped_async(self, buf, offset=0, size=None):
        self._check()
        size = buf.size - offset if size is None else size
        out = await self.js.readMapped(buf.handle, offset, size)
        return out.to_bytes()

    async def read_async(self, buf, offset=0, size=None):
        self._check()
        size = buf.size - offset if size is None else size
        out = await self.js.read(self.device, buf.handle, offset, size)
        return out.to_bytes()
