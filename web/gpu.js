// The WebGPU side of pyapp/gpu/browser.py (BrowserDevice). A module, not code Python evaluates,
// so the page's Content-Security-Policy needs no 'unsafe-eval'. FFI crossings are the cost:
// a Plan becomes one JS array once, and every submit is a single call here.

// An idle GPU's first submit of a long plan: dispatches encoded before the GPU starts (web/gpu.js submit).
const FIRST_PIECE = 32;

// A plan's dispatch op (web/gpu.js submit) into a compute pass.
function dispatch(pass, op) {
  pass.setPipeline(op[1]);
  pass.setBindGroup(0, op[2]);
  if (op[0] === 0) pass.dispatchWorkgroups(op[3], op[4], op[5]);
  else pass.dispatchWorkgroupsIndirect(op[3], op[4]);
}

// A helper per device: it keeps a staging buffer of that device.
export function createHelper() {
  return {
    usage: {
      storage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC,
      uniform: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
      readback: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
      indirect: GPUBufferUsage.INDIRECT | GPUBufferUsage.COPY_DST,
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
    // Small writes (a step's uniforms, sampling parameters: a few every token) go through this array:
    // Python copies its bytes in (TypedArray.assign) and writeStaged sends the first n. A buffer proxy
    // and its getBuffer cost ~4x as much per call in Pyodide as that copy and one plain call.
    staging: new Uint8Array(4096),
    writeStaged(device, buf, offset, n) {
      device.queue.writeBuffer(buf, offset, this.staging, 0, n);
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
    async uploadBlobs(device, blob, copies, chunk) {
      // copies: flat [buffer, dstOffset, offset, n, ...], all read at once
      const all = [];
      for (let i = 0; i < copies.length; i += 4)
        all.push(this.uploadBlob(device, copies[i], copies[i + 1], blob, copies[i + 2], copies[i + 3], chunk));
      await Promise.all(all);
    },
    // Pipelines made, and those the GPU process has compiled: createComputePipeline returns at once and the
    // compile happens there, in order, so a queue callback after each one resolves when that one is compiled.
    programs: {made: 0, done: 0},
    pipeline(device, code, entryPoint, constants, label) {
      const module = device.createShaderModule({code, label});
      const p = device.createComputePipeline({layout: "auto", label, compute: {module, entryPoint, constants}});
      const programs = this.programs;
      programs.made++;
      const done = () => { programs.done++; };
      device.queue.onSubmittedWorkDone().then(done, done);
      return p;
    },
    // Resolves when every pipeline made so far is compiled (the load waits for this rather than the first reply).
    programsReady(device) {
      return device.queue.onSubmittedWorkDone();
    },
    bindGroup(device, pipeline, entries) {
      // entries: flat [binding, buffer, offset, size, ...]
      const list = [];
      for (let i = 0; i < entries.length; i += 4)
        list.push({binding: entries[i], resource: {buffer: entries[i + 1], offset: entries[i + 2], size: entries[i + 3]}});
      return device.createBindGroup({layout: pipeline.getBindGroupLayout(0), entries: list});
    },
    // Submits in flight (queue.submit through here, not yet done on the GPU): none means the GPU is idle.
    inflight: 0,
    send(device, enc) {
      device.queue.submit([enc.finish()]);
      this.inflight++;
      const done = () => { this.inflight--; };
      device.queue.onSubmittedWorkDone().then(done, done);
    },
    submit(device, ops) {
      // ops: [0, pipeline, bindGroup, x, y, z] dispatch | [1, src, srcOff, dst, dstOff, size] copy |
      // [2, pipeline, bindGroup, buffer, offset] dispatch of the counts there.
      // On an idle GPU the plan goes out in pieces of FIRST_PIECE dispatches, then four times as many
      // each: the GPU starts on the first while the rest are encoded (a prompt's first chunk is 600-900
      // dispatches, 4-8 ms of encoding on Dawn that the GPU would otherwise wait out). A busy GPU (a later
      // chunk, a step decoded ahead) has work queued: the plan goes out whole, in one submit.
      // An exception mid-plan leaves the pieces sent before it to run, where a whole plan ran nothing; it
      // means a lost device (BrowserDevice._check reports it) or an invalid op (a bug), either way no result.
      let enc = device.createCommandEncoder();
      let pass = null, n = 0, size = FIRST_PIECE, end = this.inflight === 0 ? size : Infinity, pending = false;
      for (const op of ops) {
        if (op[0] !== 1) {
          if (!pass) pass = enc.beginComputePass();
          dispatch(pass, op);
          pending = true;
          if (++n === end) {
            pass.end(); pass = null;
            this.send(device, enc);
            enc = device.createCommandEncoder();
            pending = false;
            size *= 4;
            end = n + size;
          }
        } else {
          if (pass) { pass.end(); pass = null; }
          enc.copyBufferToBuffer(op[1], op[2], op[3], op[4], op[5]);
          pending = true;
        }
      }
      if (pass) pass.end();
      if (pending || ops.length === 0) this.send(device, enc);
    },
    async timePlan(device, ops, repeat, perDispatch) {
      // Profiling (bench/gpu_profile.py): encodes the plan as submit() does (but whole, one submit), `repeat` times, with
      // timestamp queries: perDispatch false: the first pass's start and the last pass's end;
      // true: every dispatch in a pass of its own, its start and end. Returns {cpu: ms of each
      // encode + submit, ns: the stamps in order (ns as numbers)}. Needs "timestamp-query".
      const nd = ops.reduce((n, op) => n + (op[0] !== 1), 0);
      const per = perDispatch ? 2 * nd : 2;
      const cpu = [], sets = [];
      let lastD = -1;
      ops.forEach((op, i) => { if (op[0] !== 1) lastD = i; });
      for (let r = 0; r < repeat; r++) {
        const qs = device.createQuerySet({type: "timestamp", count: per});
        const res = device.createBuffer({size: 8 * per, usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC});
        const rd = device.createBuffer({size: 8 * per, usage: this.usage.readback});
        const t0 = performance.now();
        const enc = device.createCommandEncoder();
        let pass = null, q = 0, first = true;
        ops.forEach((op, i) => {
          if (op[0] !== 1) {
            if (!pass) {
              // does this pass reach the last dispatch (no copy between here and it)?
              let last = true;
              for (let j = i; j < lastD; j++) if (ops[j][0] === 1) { last = false; break; }
              const tw = {querySet: qs};
              if (perDispatch) { tw.beginningOfPassWriteIndex = q++; tw.endOfPassWriteIndex = q++; }
              else {
                if (first) tw.beginningOfPassWriteIndex = 0;
                if (last) tw.endOfPassWriteIndex = 1;
              }
              pass = (perDispatch || first || last) ? enc.beginComputePass({timestampWrites: tw}) : enc.beginComputePass();
              first = false;
            }
            dispatch(pass, op);
            if (perDispatch) { pass.end(); pass = null; }
          } else {
            if (pass) { pass.end(); pass = null; }
            enc.copyBufferToBuffer(op[1], op[2], op[3], op[4], op[5]);
          }
        });
        if (pass) pass.end();
        enc.resolveQuerySet(qs, 0, per, res, 0);
        enc.copyBufferToBuffer(res, 0, rd, 0, 8 * per);
        device.queue.submit([enc.finish()]);
        cpu.push(performance.now() - t0);
        sets.push([qs, res, rd]);
      }
      const ns = [];
      for (const [qs, res, rd] of sets) {
        await rd.mapAsync(GPUMapMode.READ);
        for (const v of new BigUint64Array(rd.getMappedRange())) ns.push(Number(v));
        rd.unmap(); rd.destroy(); res.destroy(); qs.destroy();
      }
      return {cpu, ns};
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
