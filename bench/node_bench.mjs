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
py.registerJsModule("webgpu_helper", { createHelper });
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
        r = await bench_async(eng, prompt_tokens=${Number(process.env.PROMPT_TOKENS || 256)},
                              gen_tokens=${Number(process.env.GEN_TOKENS || 64)}, repeat=${Number(process.env.REPEAT || 3)},
                              temperature=${Number(process.env.TEMPERATURE || 0)},
                              speculate=${Number(process.env.SPECULATE || 0)},
                              prompt=${JSON.stringify(process.env.PROMPT_KIND || "random")})
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
process.exit(0);
