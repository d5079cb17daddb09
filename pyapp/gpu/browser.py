"""Browser backend: navigator.gpu through Pyodide's JS FFI (runs only in Pyodide).

FFI crossings are the cost here, so the per-token paths live in a small JS
helper (_JS): a Plan is turned into one JS array once, and every submit is a
single call that encodes all dispatches and submits them. Tensor bytes from a
Blob/File go Blob.slice -> ArrayBuffer -> writeBuffer inside JS, never through
Python's heap; Python bytes are written through a zero-copy view of wasm memory.
"""

from __future__ import annotations

import js  # type: ignore[import-not-found]
from pyodide.code import run_js  # type: ignore[import-not-found]
from pyodide.ffi import to_js  # type: ignore[import-not-found]

from . import LIMIT_NAMES, UPLOAD_CHUNK, Device, GPUError, Plan

_JS = r"""
({
  usage: {
    storage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC,
    uniform: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
    readback: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
  },
  async init(opts) {
    if (!navigator.gpu) throw new Error("WebGPU is not available in this browser (navigator.gpu is missing)");
    const adapter = await navigator.gpu.requestAdapter({powerPreference: "high-performance"});
    if (!adapter) throw new Error("no WebGPU adapter (GPU blocklisted or disabled?)");
    const features = opts.features.filter(f => adapter.features.has(f));
    const requiredLimits = {};
    for (const k of opts.limits) if (adapter.limits[k] !== undefined) requiredLimits[k] = adapter.limits[k];
    const device = await adapter.requestDevice({requiredFeatures: features, requiredLimits});
    const state = {lost: undefined, error: undefined};  // undefined -> None in Python
    device.lost.then(info => { state.lost = `${info.reason}: ${info.message}`; });
    device.onuncapturederror = ev => { state.error = ev.error.message; console.error("WebGPU:", ev.error.message); };
    const limits = {};
    for (const k of opts.limits) limits[k] = device.limits[k];
    const info = adapter.info || {};
    return {adapter, device, state, features, limits,
            info: {vendor: info.vendor || "", architecture: info.architecture || "",
                   device: info.device || "", description: info.description || ""}};
  },
  buffer(device, size, kind, label) {
    return device.createBuffer({size, usage: this.usage[kind], label});
  },
  write(device, buf, offset, py) {
    // py: a Python bytes-like proxy; write straight from wasm memory (writeBuffer copies)
    const view = py.getBuffer("u8");
    try { device.queue.writeBuffer(buf, offset, view.data); } finally { view.release(); }
  },
  async uploadBlob(device, buf, dstOffset, blob, offset, n, chunk) {
    for (let done = 0; done < n; done += chunk) {
      const k = Math.min(chunk, n - done);
      let data = new Uint8Array(await blob.slice(offset + done, offset + done + k).arrayBuffer());
      if (data.length !== k) throw new Error(`short read of the model file at ${offset + done}`);
      if (k % 4) { const p = new Uint8Array(k + 4 - k % 4); p.set(data); data = p; }
      device.queue.writeBuffer(buf, dstOffset + done, data);
    }
  },
  pipeline(device, code, entryPoint, constants, label) {
    const module = device.createShaderModule({code, label});
    return device.createComputePipeline({layout: "auto", label,
                                         compute: {module, entryPoint, constants}});
  },
  bindGroup(device, pipeline, entries) {
    // entries: flat [binding, buffer, offset, size, ...]
    const list = [];
    for (let i = 0; i < entries.length; i += 4)
      list.push({binding: entries[i], resource: {buffer: entries[i + 1], offset: entries[i + 2], size: entries[i + 3]}});
    return device.createBindGroup({layout: pipeline.getBindGroupLayout(0), entries: list});
  },
  submit(device, ops) {
    // ops: [0, pipeline, bindGroup, x, y, z] dispatch | [1, src, srcOff, dst, dstOff, size] copy
    const enc = device.createCommandEncoder();
    let pass = null;
    for (const op of ops) {
      if (op[0] === 0) {
        if (!pass) pass = enc.beginComputePass();
        pass.setPipeline(op[1]);
        pass.setBindGroup(0, op[2]);
        pass.dispatchWorkgroups(op[3], op[4], op[5]);
      } else {
        if (pass) { pass.end(); pass = null; }
        enc.copyBufferToBuffer(op[1], op[2], op[3], op[4], op[5]);
      }
    }
    if (pass) pass.end();
    device.queue.submit([enc.finish()]);
  },
  async readMapped(buf, offset, size) {
    // a MAP_READ buffer a plan copied into: resolves when that plan is done, not later ones
    await buf.mapAsync(GPUMapMode.READ, offset, size);
    try { return new Uint8Array(buf.getMappedRange(offset, size).slice(0)); } finally { buf.unmap(); }
  },
  async read(device, buf, offset, size) {
    const n = (size + 3) & ~3;
    // one staging buffer reused while free (token ids are read every step)
    let st = this._staging;
    if (!this._busy && st && st.size < n) { st.destroy(); st = null; }
    if (!st || this._busy) st = device.createBuffer({size: Math.max(n, 256), usage: this.usage.readback});
    const pooled = !this._busy;
    if (pooled) { this._staging = st; this._busy = true; }
    try {
      const enc = device.createCommandEncoder();
      enc.copyBufferToBuffer(buf, offset, st, 0, n);
      device.queue.submit([enc.finish()]);
      await st.mapAsync(GPUMapMode.READ, 0, n);
      const out = new Uint8Array(st.getMappedRange(0, n).slice(0, size));
      st.unmap();
      return out;
    } finally {
      if (pooled) this._busy = false; else st.destroy();
    }
  },
})
"""

# camelCase names of LIMIT_NAMES
_JS_LIMITS = {n: n.split("_")[0] + "".join(w.capitalize() for w in n.split("_")[1:]) for n in LIMIT_NAMES}


def _obj(d: dict):
    return to_js(d, dict_converter=js.Object.fromEntries)


def _constants(d: dict):
    """Pipeline override constants: WebGPU takes numbers (Dawn's Node binding rejects booleans)."""
    return _obj({k: (int(v) if isinstance(v, bool) else v) for k, v in d.items()})


class BrowserDevice(Device):
    backend = "browser"

    @classmethod
    async def create(cls) -> "BrowserDevice":
        helper = run_js(_JS)
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
        self.js.write(self.device, buf.handle, offset, data)

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

    def _create_pipeline(self, source, entry, constants, label):
        self._check()
        return self.js.pipeline(self.device, source, entry, _constants(constants), label)

    def _create_bind_group(self, pipeline, entries):
        flat = []
        for i, b, off, size in entries:
            flat += [i, b.handle, off, size]
        return self.js.bindGroup(self.device, pipeline.handle, to_js(flat))

    def _submit(self, plan: Plan):
        self._check()
        if plan._native is None:  # built once per plan; replays cost one FFI call
            ops = []
            for op in plan.ops:
                if op[0] == "d":
                    _, p, bg, x, y, z = op
                    ops.append([0, p.handle, bg.handle, x, y, z])
                else:
                    _, src, so, dst, do, n = op
                    ops.append([1, src.handle, so, dst.handle, do, n])
            plan._native = to_js(ops)
        self.js.submit(self.device, plan._native)

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
