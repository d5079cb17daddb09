// The app's engine room: Pyodide + our Python package (pyapp) in a dedicated worker,
// so the page never freezes. The page sends {id, cmd, args}; we answer {id, result}
// and forward the events Python posts ({event: "progress" | "token" | ...}).
import { loadPyodide } from "./pyodide/pyodide.mjs";
import { createHelper } from "./gpu.js";

// File System Access helpers Python calls (js.fsList / fsFile / fsExists).
async function walk(root, path, wantFile) {
  const parts = path.split("/").filter(Boolean);
  let dir = root;
  const last = wantFile ? parts.pop() : null;
  for (const p of parts) dir = await dir.getDirectoryHandle(p);
  return wantFile ? dir.getFileHandle(last) : dir;
}
self.fsList = async (root, path) => {
  const dir = await walk(root, path, false);
  const out = [];
  for await (const [name, h] of dir.entries()) out.push([name, h.kind === "directory"]);
  return out;
};
self.fsFile = async (root, path) => (await walk(root, path, true)).getFile();
self.fsExists = async (root, path) => {
  try { await walk(root, path, false); return true; } catch (e) {}
  try { await walk(root, path, true); return true; } catch (e) { return false; }
};

let pyodide = null;
let webapp = null;
let commands = new Set();   // pyapp.webapp's declared commands (@command): the only names this worker runs

const ready = (async () => {
  postMessage({ event: "status", text: "Starting Python (Pyodide)…" });
  pyodide = await loadPyodide({ indexURL: new URL("./pyodide/", import.meta.url).href });
  pyodide.registerJsModule("webgpu_helper", { createHelper });     // pyapp.gpu.browser's WebGPU calls
  const zip = await (await fetch(new URL("./pyapp.zip", import.meta.url))).arrayBuffer();
  pyodide.unpackArchive(zip, "zip", { extractDir: "/home/pyodide/app" });
  pyodide.runPython("import sys; sys.path.insert(0, '/home/pyodide/app')");
  webapp = pyodide.pyimport("pyapp.webapp");
  commands = new Set(toJs(webapp.command_names()));
  postMessage({ event: "status", text: "Python ready" });
})();

function toJs(value) {
  if (value && typeof value.toJs === "function") {
    const out = value.toJs({ dict_converter: Object.fromEntries, create_pyproxies: false });
    value.destroy();
    return out;
  }
  return value;
}

// Commands the worker runs in JS: an image decoded and resized here, off the page's thread, at the size the
// chosen model takes (pyapp.webapp.image_size). Each returns [result, the buffers to transfer to the page].
async function prepareImage(blob, budget) {
  const name = (blob && blob.name) || "the image";
  let bitmap;
  try {
    // colour values as stored (no ICC conversion) and the EXIF orientation applied, as transformers' loader does
    bitmap = await createImageBitmap(blob, { imageOrientation: "from-image", colorSpaceConversion: "none" });
  } catch (e) {
    return [{ error: `\u201c${name}\u201d is not an image this browser can read: choose a PNG, JPEG, WebP or GIF.`,
              detail: String((e && e.message) || e), image_error: true }, []];
  }
  try {
    const size = toJs(webapp.image_size(bitmap.width, bitmap.height, budget));
    if (size.error) return [size, []];
    const canvas = new OffscreenCanvas(size.width, size.height);
    const ctx = canvas.getContext("2d", { willReadFrequently: true });
    ctx.imageSmoothingQuality = "high";
    ctx.drawImage(bitmap, 0, 0, size.width, size.height);
    const data = ctx.getImageData(0, 0, size.width, size.height).data;   // RGBA8, row-major
    const pixels = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
    return [{ ...size, budget, original: { width: bitmap.width, height: bitmap.height }, pixels }, [pixels.buffer]];
  } finally {
    bitmap.close();
  }
}
const jsCommands = new Map([["prepare_image", prepareImage]]);

// Chrome shows a worker's CSP violations only in DevTools: say them in the console the page sees too.
self.addEventListener("securitypolicyviolation", (e) =>
  console.error(`Content-Security-Policy blocked ${e.blockedURI || "code"} (${e.effectiveDirective})`));

self.onmessage = async (ev) => {
  const { id, cmd, args = [] } = ev.data;
  try {
    await ready;
    if (jsCommands.has(cmd)) {
      const [result, transfer] = await jsCommands.get(cmd)(...args);
      postMessage({ id, result }, transfer);
      return;
    }
    // a Set of names, not an object: `cmd in obj` would accept inherited names such as toString
    if (!commands.has(cmd)) throw new Error(`unknown command ${cmd}`);
    const result = toJs(await webapp[cmd](...args));
    postMessage({ id, result });
  } catch (err) {
    // Python tracebacks: keep the last line (the exception) for the page, log the rest
    const text = String((err && err.message) || err);
    console.error(text);
    const lines = text.trim().split("\n");
    postMessage({ id, result: { error: lines[lines.length - 1] || text } });
  }
};
