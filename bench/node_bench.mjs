// The browser code path without a browser: Pyodide + our pyapp + Dawn (Chrome's WebGPU,
// from the npm `webgpu` package) in Node. Same BrowserDevice and engine code as the page.
//
//   node bench/node_bench.mjs MODEL.gguf [MODEL2.gguf ...]
//   node bench/node_bench.mjs --train MODEL.gguf      LoRA training instead (bench/train_bench.py's
//        measure_async): SEQ_LEN (256), BATCH (4), RANK (8), STEPS (6)
//   node bench/node_bench.mjs --gpu-profile MODEL.gguf   where a decode step's GPU time goes (bench/gpu_profile.py;
//        FEW=N: a speculative step of 1 + N tokens; PROFILE_PREFILL=1: a prefill chunk; PROFILE_PROMPT,
//        PROFILE_CONTEXT: after a prompt of that many tokens (512) in that context (2048))
//   node bench/node_bench.mjs --matvec-rounded         the down projection reading x rounded by its producer, by threads
//        (bench/matvec_sweep.py --rounded): SWEEP_SHAPES, SWEEP_QUANTS ("q6_k q4_k q4_0")
//   node bench/node_bench.mjs --peak                   int8 DP4A and f32 FMA ceilings (bench/peak_probe.py)
//   node bench/node_bench.mjs --overlap                do independent dispatches overlap (bench/overlap_probe.py)
//   node bench/node_bench.mjs --vision MMPROJ.gguf [TEXT.gguf]   image encoding and time to first token with one
//        image (bench/vision_bench.py's measure_async): VISION_BUDGETS ("280 1120"), VISION_REPEAT (5),
//        VISION_PNG_DIR (/tmp/h100/vision: img-BUDGET.png, written by bench/vision_bench.py --png-dir)
//   node bench/node_bench.mjs --audio MMPROJ.gguf [TEXT.gguf]   audio encoding (the log-mel features in Pyodide, then from samples on the GPU) and
//        time to first token with one clip (bench/audio_bench.py's measure_async): AUDIO_SECONDS ("10 30"),
//        AUDIO_REPEAT (5), AUDIO_WAV_DIR (/tmp/h100/audio: clip-Ss.wav, written by bench/audio_bench.py --wav-dir)
//   node bench/node_bench.mjs --sweep                  the prefill matmul by tile shape (bench/matmul_sweep.py):
//        SWEEP_TOKENS (512), SWEEP_SHAPES ("ROWSxCOLS ...", default its SHAPES), SWEEP_QUANTS ("q4_k"),
//        SWEEP_ALL_TILES=1 (every f32 tile of its tiles());
//        ATTENTION_AT=POS: only the attention of a chunk at POS (its LONG_ATTENTION_SHAPES, or ATTENTION_SHAPES:
//        "HEADSxKV_HEADSxHEAD_DIMxWINDOW ...")
// Env: PYODIDE_DIR (default node_modules/pyodide), WEBGPU_DIR (default node_modules/webgpu),
//      PROMPT_TOKENS (256), GEN_TOKENS (64), CONTEXT (2048), CHUNK (the engine's default: prefill step),
//      REPEAT (3: timed runs after a warm-up over the same prompt; medians reported),
//      GPU_MEMORY (MiB: the GPU memory budget; experts stream from the file beyond it), INT8 (0: Engine.open(int8=False):
//      every matmul and matvec on f32 activations),
//      TEMPERATURE (0: greedy decoding), SPECULATE (0: off; N: speculative decoding, up to N
//      prompt-lookup drafts checked per step, greedy only), PROMPT_KIND (random: random ids; repeat:
//      a random block of 16 ids repeated), DRAFTER (an assistant drafter GGUF: it drafts instead of prompt
//      lookup; with SPECULATE N, what a round of N drafts costs and the acceptance that pays for it),
//      DRAFTER_LOOKUP (0: the drafter drafts every round, prompt lookup not even where the text repeats),
//      BLOB (0: the model's bytes go through Pyodide's file system (NODEFS) and Python into writeBuffer; 1: as the
//      page's do, Blob -> writeBuffer inside JS, FileBlob standing for the picked File: slower in Node, whose
//      file reads then go through libuv's thread pool, so not the default).
//      TRACE (1: where a decode token's time goes on the host and the GPU: each submit's GPU begin and end by
//      timestamps, its encoding, and per token the Python time, the submits' and the wait for the sampled id, over
//      the last generation's decode; one JSON line more), PROFILE_PY (1: the Python side under cProfile, to stderr).
// A DiffusionGemma file is measured by denoising (bench/engine_bench.py's bench_async, as bench/bench.py does):
//      PROMPT_TOKENS (128), GEN_TOKENS (256: one canvas), STEPS (the model's max denoising steps).
// Reports the wasm heap (Pyodide's memory: it only grows, so its size at the end is the peak).
// Prints one JSON line per model.
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const root = path.resolve(path.dirname(new URL(import.meta.url).pathname), "..");
const pyodideDir = path.resolve(process.env.PYODIDE_DIR || path.join(root, "node_modules/pyodide"));
const webgpuDir = path.resolve(process.env.WEBGPU_DIR || path.join(root, "node_modules/webgpu"));
process.on("uncaughtException", (e) => { console.error("error:", String((e && e.message) || e).slice(-4000)); process.exit(1); });
process.on("unhandledRejection", (e) => { console.error("error:", String((e && e.message) || e).slice(-4000)); process.exit(1); });
const { loadPyodide } = await import(pathToFileURL(path.join(pyodideDir, "pyodide.mjs")).href);
const py = await loadPyodide({ indexURL: pyodideDir + "/" });
// after Pyodide's boot: a navigator set earlier breaks it
const { create, globals } = await import(pathToFileURL(path.join(webgpuDir, "index.js")).href);
Object.assign(globalThis, globals);
// full-precision timestamps for --gpu-profile (Chrome quantizes them unless its developer features are on)
globalThis.navigator = { gpu: create(["disable-dawn-features=timestamp_quantization"]) };

py.FS.mkdirTree("/repo");
py.FS.mount(py.FS.filesystems.NODEFS, { root }, "/repo");
py.FS.mkdirTree("/models");
py.FS.mount(py.FS.filesystems.NODEFS, { root: "/" }, "/models");
py.runPython("import sys; sys.path.insert(0, '/repo')");
// the page's WebGPU helper, registered as web/worker.js does
const { createHelper } = await import(pathToFileURL(path.join(root, "web/gpu.js")).href);
// TRACE=1: every queue submit's GPU begin and end (an empty timestamped pass at each end of its encoder) and its
// CPU encoding time, then where the GPU sat idle between the last generation's decode submits
// (bench-only: the device's createCommandEncoder is patched here, the app's code is the same).
const trace = process.env.TRACE === "1" ? { records: [], slots: 4096, ops: 0 } : null;
function traced(helper) {
  // CPU side of each token: submit() calls (encode + submit) and readMapped's wait (the sampled id's readback)
  trace.cpu = [];
  const submit = helper.submit.bind(helper), readMapped = helper.readMapped.bind(helper);
  helper.submit = (device, ops) => {
    const t = performance.now();
    trace.ops = ops.length;                          // the plan's size, for each encoder it makes (its kind)
    submit(device, ops);
    trace.ops = 0;
    trace.cpu.push(["submit", t, performance.now()]);
  };
  helper.readMapped = async (buf, offset, size) => {
    const t = performance.now();
    try { return await readMapped(buf, offset, size); } finally { trace.cpu.push(["read", t, performance.now()]); }
  };
  const init = helper.init.bind(helper);
  helper.init = async (opts) => {
    const r = await init(opts);
    const device = r.device;
    trace.device = device;
    trace.qs = device.createQuerySet({ type: "timestamp", count: trace.slots });
    const make = device.createCommandEncoder.bind(device);
    device.createCommandEncoder = (desc) => {
      const enc = make(desc);
      const rec = { i: trace.records.length, t0: performance.now(), ops: trace.ops };
      trace.records.push(rec);
      const slot = (2 * rec.i) % trace.slots;
      enc.beginComputePass({ timestampWrites: { querySet: trace.qs, beginningOfPassWriteIndex: slot } }).end();
      const begin = enc.beginComputePass.bind(enc);
      const finish = enc.finish.bind(enc);
      enc.finish = (d) => {
        begin({ timestampWrites: { querySet: trace.qs, endOfPassWriteIndex: slot + 1 } }).end();
        rec.t1 = performance.now();
        return finish(d);
      };
      return enc;
    };
    return r;
  };
  return helper;
}
async function traceReport() {
  // the last generation's decode: the submits after the last prefill chunk (a plan of more than 400 ops)
  const { device, qs, slots, records } = trace;
  const res = device.createBuffer({ size: 8 * slots, usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC });
  const rd = device.createBuffer({ size: 8 * slots, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
  const enc = device.createCommandEncoder();      // itself recorded: the last record, dropped below
  enc.resolveQuerySet(qs, 0, slots, res, 0);
  enc.copyBufferToBuffer(res, 0, rd, 0, 8 * slots);
  device.queue.submit([enc.finish()]);
  await rd.mapAsync(GPUMapMode.READ);
  const ns = Array.from(new BigUint64Array(rd.getMappedRange()), Number);
  let recs = records.slice(0, -1).slice(-slots / 2);
  let last = -1;
  recs.forEach((r, k) => { if (r.ops > 400) last = k; });
  recs = recs.slice(last + 2);                     // after the last chunk and its head's sampling
  for (const r of recs) { const s = (2 * r.i) % slots; r.b = ns[s]; r.e = ns[s + 1]; }
  const stats = (xs) => {
    const s = [...xs].sort((x, y) => x - y), q = (f) => Math.round(s[Math.floor(f * (s.length - 1))]);
    return { n: s.length, sum_ms: Math.round(s.reduce((x, y) => x + y, 0)) / 1e3, p10: q(0.1), med: q(0.5), p90: q(0.9), max: q(1) };
  };
  const kinds = {};
  recs.forEach((r, k) => {
    const kind = r.ops > 50 ? "step" : r.ops > 0 ? "small plan" : "other";      // other: a read's copy, ...
    const o = kinds[kind] || (kinds[kind] = { gpu_us: [], idle_before_us: [], encode_us: [], cpu_since_last_us: [] });
    o.gpu_us.push((r.e - r.b) / 1e3);
    o.encode_us.push((r.t1 - r.t0) * 1e3);
    if (k > 0) { o.idle_before_us.push(Math.max(0, r.b - recs[k - 1].e) / 1e3); o.cpu_since_last_us.push((r.t1 - recs[k - 1].t1) * 1e3); }
  });
  for (const o of Object.values(kinds)) for (const k of Object.keys(o)) o[k] = stats(o[k]);
  // per token, from a read's end (the id known) to the next read's end: python (the CPU outside submit and the
  // wait), submit (encode + queue.submit of the sampling and the step), wait (readMapped until it resolves)
  const cpu = trace.cpu.filter((c) => c[1] >= recs[0].t0);
  const tok = { python_us: [], submit_us: [], wait_us: [] };
  let from = null, sub = 0;
  for (const [kind, t0, t1] of cpu) {
    if (kind === "submit") { sub += t1 - t0; continue; }
    if (from !== null) {
      tok.wait_us.push((t1 - t0) * 1e3);
      tok.submit_us.push(sub * 1e3);
      tok.python_us.push((t1 - from - (t1 - t0) - sub) * 1e3);
    }
    from = t1; sub = 0;
  }
  for (const k of Object.keys(tok)) tok[k] = stats(tok[k]);
  return { per_token_cpu: tok, decode_submits: recs.length, span_ms: (recs[recs.length - 1].e - recs[0].b) / 1e6,
           wall_ms: recs[recs.length - 1].t1 - recs[0].t0, kinds };
}
py.registerJsModule("webgpu_helper", { createHelper: trace ? () => traced(createHelper()) : createHelper });
// Pyodide's wasm memory (the Python heap lives in it); 0 where this Pyodide hides it
// The model file as the page's File is (BLOB=1): slice(a, b).arrayBuffer() reads those bytes in JS, so weights and
// streamed experts copy file -> GPU without Python. (fs.openAsBlob's slices read short past 2 GiB in Node 20.)
class FileBlob {
  constructor(handle, start, end) { Object.assign(this, { handle, start, end }); }
  get size() { return this.end - this.start; }
  slice(a, b) { return new FileBlob(this.handle, this.start + a, this.start + Math.min(b, this.size)); }
  async arrayBuffer() {
    const bytes = Buffer.allocUnsafeSlow(this.size);      // its own ArrayBuffer, not zeroed: read once, not copied
    const { bytesRead } = await this.handle.read(bytes, 0, bytes.length, this.start);
    return bytesRead === bytes.length ? bytes.buffer : bytes.buffer.slice(0, bytesRead);
  }
}
globalThis.open_model_blob = async (p) => {
  const handle = await fs.promises.open(p, "r");
  return new FileBlob(handle, 0, (await handle.stat()).size);
};
globalThis.wasm_heap_bytes = () => (py._module && py._module.HEAP8 ? py._module.HEAP8.buffer.byteLength : 0);
const train = process.argv.includes("--train");
if (process.argv.includes("--sweep")) {
  console.log(await py.runPythonAsync(`
import json, sys
sys.path.insert(0, "/repo/bench")
import matmul_sweep
from pyapp.gpu import get_device_async
shapes = [tuple(int(v) for v in s.split("x")) for s in "${process.env.SWEEP_SHAPES || ""}".split()]
at = ${process.env.ATTENTION_AT === undefined ? "None" : Number(process.env.ATTENTION_AT)}
quants = tuple("${process.env.SWEEP_QUANTS || "q4_k"}".split())
dev = await get_device_async("browser")
if at is not None:
    heads = [tuple(int(v) for v in s.split("x")) for s in "${process.env.ATTENTION_SHAPES || ""}".split()]
    rows = await matmul_sweep.attention_sweep_async(dev, shapes=heads or matmul_sweep.LONG_ATTENTION_SHAPES, pos0=at)
else:
    rows = await matmul_sweep.sweep_async(dev, quants, n_tokens=${Number(process.env.SWEEP_TOKENS || 512)},
                                          shapes=shapes or matmul_sweep.SHAPES,
                                          tile_list=${process.env.SWEEP_ALL_TILES === "1" ? "matmul_sweep.tiles()" : "None"})
    if not shapes:
        rows += await matmul_sweep.moe_sweep_async(dev)
        rows = await matmul_sweep.attention_sweep_async(dev) + rows
"\\n".join(json.dumps(r) for r in rows)
`));
  process.exit(0);
}
if (process.argv.includes("--matvec-rounded")) {
  console.log(await py.runPythonAsync(`
import json, sys
sys.path.insert(0, "/repo/bench")
import matvec_sweep
from pyapp.gpu import get_device_async
shapes = [tuple(int(v) for v in s.split("x")) for s in "${process.env.SWEEP_SHAPES || ""}".split()]
quants = tuple("${process.env.SWEEP_QUANTS || "q6_k q4_k q4_0"}".split())
rows = await matvec_sweep.rounded_sweep_async(await get_device_async("browser"), shapes=shapes or matvec_sweep.ROUNDED_SHAPES,
                                              quants=quants)
"\\n".join(json.dumps(r) for r in rows)
`));
  process.exit(0);
}
// bench modules whose probe_async(dev) measures the device alone: their JSON rows, one a line
for (const [flag, module] of [["--overlap", "overlap_probe"], ["--peak", "peak_probe"]]) {
  if (!process.argv.includes(flag)) continue;
  console.log(await py.runPythonAsync(`
import json, sys
sys.path.insert(0, "/repo/bench")
import ${module}
from pyapp.gpu import get_device_async
rows = await ${module}.probe_async(await get_device_async("browser"))
"\\n".join(json.dumps(r) for r in rows)
`));
  process.exit(0);
}
if (process.argv.includes("--gpu-profile")) {
  const m = "/models" + path.resolve(process.argv.slice(2).filter((a) => !a.startsWith("--"))[0]);
  console.log(await py.runPythonAsync(`
import json, sys
sys.path.insert(0, "/repo/bench")
import gpu_profile
from pyapp.engine import Engine
from pyapp.gguf import read_gguf
from pyapp.gpu import get_device_async
eng = await Engine.open_async(read_gguf("${m}"), await get_device_async("browser"),
                              context_length=${Number(process.env.PROFILE_CONTEXT || 2048)},
                              int8=${process.env.INT8 === "0" ? "False" : "True"})
rows = await gpu_profile.profile_async(eng, few=${Number(process.env.FEW || 0)},
                                       prefill=${process.env.PROFILE_PREFILL === "1" ? "True" : "False"},
                                       prompt=${Number(process.env.PROFILE_PROMPT || 512)})
"\\n".join(json.dumps(r) for r in rows)
`));
  process.exit(0);
}
if (process.argv.includes("--vision")) {
  const files = process.argv.slice(2).filter((a) => !a.startsWith("--")).map((m) => "/models" + path.resolve(m));
  const budgets = (process.env.VISION_BUDGETS || "280 1120").split(/\s+/).filter(Boolean).map(Number);
  console.log(await py.runPythonAsync(`
import json, sys
sys.path.insert(0, "/repo/bench")
import vision_bench
from pyapp.gpu import get_device_async
files = ${JSON.stringify(files)}
rows = await vision_bench.measure_async(await get_device_async("browser"), files[0], files[1] if len(files) > 1 else None,
                                        "/models" + ${JSON.stringify(path.resolve(process.env.VISION_PNG_DIR || "/tmp/h100/vision"))},
                                        budgets=${JSON.stringify(budgets)}, repeat=${Number(process.env.VISION_REPEAT || 5)},
                                        context=4096, chunk=2048)
"\\n".join(json.dumps(r) for r in rows)
`));
  process.exit(0);
}
if (process.argv.includes("--audio")) {
  const files = process.argv.slice(2).filter((a) => !a.startsWith("--")).map((m) => "/models" + path.resolve(m));
  const seconds = (process.env.AUDIO_SECONDS || "10 30").split(/\s+/).filter(Boolean).map(Number);
  console.log(await py.runPythonAsync(`
import json, sys
sys.path.insert(0, "/repo/bench")
import audio_bench
from pyapp.gpu import get_device_async
files = ${JSON.stringify(files)}
rows = await audio_bench.measure_async(await get_device_async("browser"), files[0], files[1] if len(files) > 1 else None,
                                       "/models" + ${JSON.stringify(path.resolve(process.env.AUDIO_WAV_DIR || "/tmp/h100/audio"))},
                                       seconds=${JSON.stringify(seconds)}, repeat=${Number(process.env.AUDIO_REPEAT || 5)},
                                       context=4096, chunk=2048)
"\\n".join(json.dumps(r) for r in rows)
`));
  process.exit(0);
}
const models = process.argv.slice(2).filter((a) => a !== "--train").map((m) => "/models" + path.resolve(m));
const run = py.runPythonAsync(`
import json, sys, time
sys.path.insert(0, "/repo/bench")
from engine_bench import bench_async
from pyapp.engine import Engine
from pyapp.gguf import read_gguf
from pyapp.gpu import get_device_async
from js import wasm_heap_bytes
dev = await get_device_async("browser")

def heap_mib():
    return round(wasm_heap_bytes() / 2**20)

out = []
for m in ${JSON.stringify(models)}:
    g = read_gguf(m)
    if ${process.env.BLOB === "1" ? "True" : "False"}:
        from js import open_model_blob
        g.source.blob = await open_model_blob(m[len("/models"):])
    t = time.perf_counter()
    eng = await Engine.open_async(g, dev, context_length=${Number(process.env.CONTEXT || 2048)},
                                  chunk=${process.env.CHUNK ? Number(process.env.CHUNK) : "None"},
                                  gpu_memory_mib=${process.env.GPU_MEMORY ? Number(process.env.GPU_MEMORY) : "None"},
                                  int8=${process.env.INT8 === "0" ? "False" : "True"})
    drafter_file = ${JSON.stringify(process.env.DRAFTER ? "/models" + path.resolve(process.env.DRAFTER) : "")}
    if drafter_file:                 # an assistant drafter on the GPU drafts instead of prompt lookup
        from pyapp.families.gemma4_assistant.runner import GpuDrafter
        from pyapp.families.gemma4_assistant.source import GpuDrafts
        eng.drafter = GpuDrafts(await GpuDrafter.open_async(dev, read_gguf(drafter_file), eng.runner),
                                lookup=${process.env.DRAFTER_LOOKUP === "0" ? "False" : "True"})
    heap_after_load = heap_mib()
    load = time.perf_counter() - t
    if ${train ? "True" : "False"}:
        import train_bench
        r = await train_bench.measure_async(eng, seq_len=${Number(process.env.SEQ_LEN || 256)},
                                            batch=${Number(process.env.BATCH || 4)}, rank=${Number(process.env.RANK || 8)},
                                            steps=${Number(process.env.STEPS || 6)})
    elif hasattr(eng, "denoising"):     # DiffusionGemma: denoising's benchmark
        r = await bench_async(eng, prompt_tokens=${Number(process.env.PROMPT_TOKENS || 128)},
                              gen_tokens=${Number(process.env.GEN_TOKENS || 256)}, repeat=${Number(process.env.REPEAT || 3)},
                              steps=${process.env.STEPS ? Number(process.env.STEPS) : "None"})
    else:
        if ${process.env.PROFILE_PY === "1" ? "True" : "False"}:      # PROFILE_PY=1: the Python side by cProfile
            sys.modules.pop("profile", None)      # bench/profile.py, on sys.path, is not the standard library's
            saved = list(sys.path)
            sys.path[:] = [p for p in saved if not p.rstrip("/").endswith("bench")]
            import cProfile
            sys.path[:] = saved
            profiler = cProfile.Profile()
            profiler.enable()
        r = await bench_async(eng, prompt_tokens=${Number(process.env.PROMPT_TOKENS || 256)},
                              gen_tokens=${Number(process.env.GEN_TOKENS || 64)}, repeat=${Number(process.env.REPEAT || 3)},
                              temperature=${Number(process.env.TEMPERATURE || 0)},
                              speculate=${Number(process.env.SPECULATE || 0)},
                              prompt=${JSON.stringify(process.env.PROMPT_KIND || "random")})
        if ${process.env.PROFILE_PY === "1" ? "True" : "False"}:
            import io, pstats
            profiler.disable()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(40)
            print(text.getvalue(), file=sys.stderr)
    r.update(file=m.rsplit("/", 1)[-1], load_s=round(load, 2), runtime="pyodide+dawn (node)",
             file_bytes="blob" if hasattr(g.source, "blob") else "python",
             int8=${process.env.INT8 === "0" ? "False" : "True"},
             chunk=eng.runner.chunk,
             wasm_heap_mib_after_load=heap_after_load, wasm_heap_mib_peak=heap_mib())
    out.append(json.dumps(r))
    eng.close()
"\\n".join(out)
`);
console.log(await run);
if (trace) console.log(JSON.stringify(await traceReport()));
process.exit(0);
