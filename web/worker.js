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

// Chrome shows a worker's CSP violations only in DevTools: say them in the console the page sees too.
self.addEventListener("securitypolicyviolation", (e) =>
  console.error(`Content-Security-Policy blocked ${e.blockedURI || "code"} (${e.effectiveDirective})`));

self.onmessage = async (ev) => {
  const { id, cmd, args = [] } = ev.data;
  try {
    await ready;
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
