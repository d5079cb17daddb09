// The WebGPU side of pyapp/gpu/browser.py (BrowserDevice). A module, not code Python evaluates,
// so the page's Content-Security-Policy needs no 'unsafe-eval'. FFI crossings are the cost:
// a Plan becomes one JS array once, and every submit is a single call here.

// A helper per device: it keeps a staging buffer of that device.
export function createHelper() {
  return {
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
                     device: info.device || "", description: info.description || "",
                     fallback: !!(info.isFallbackAdapter || adapter.isFallbackAdapter)}};
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
  };
}
