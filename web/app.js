// The page: UI only. Python (Pyodide) and the GPU work live in worker.js.
import { escapeHtml, renderMarkdown } from "./markdown.js";
import { setupFinetune } from "./finetune.js";
import { setupAudio } from "./audio.js";
import { setupImages } from "./images.js";
import { setupDrafter } from "./drafter.js";

const $ = (id) => document.getElementById(id);
const CHAT_KEY = "gemma4.chat.v1";     // the one conversation earlier versions kept: moved into CHATS_KEY
const CHATS_KEY = "gemma4.chats.v1";   // every conversation: {current: id, chats: [...]}, newest first
const LAST_MODEL_KEY = "gemma4.last_model.v1";   // {kind, name, handle}: offered again after a reload
const SETTINGS_KEY = "gemma4.settings.v1";
const GPU_MEMORY_KEY = "gemma4.gpu_memory.v1";   // {adapter: MiB}: a property of the GPU, not of a model
const F16_KEY = "gemma4.f16.v1";                 // {adapter: true}: f16 prompt tiles chosen for that GPU
const PROMPT_STEP_KEY = "gemma4.prompt_step.v1"; // {adapter: tokens}: the prompt step chosen for that GPU
const PARAMS = ["temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed", "speculate", "max_tokens", "context_length",
                "denoise_steps", "denoise_t_min", "denoise_t_max", "denoise_entropy_bound"];   // the last: DiffusionGemma
// Sampling and context defaults come from Python at boot (pyapp.engine.SamplingParams, the one definition).
let DEFAULTS = {};

// ---------------------------------------------------------------- worker RPC
const worker = new Worker(new URL("./worker.js", import.meta.url), { type: "module" });
const pending = new Map();
let nextId = 1;
const listeners = { token: [], progress: [], compiling: [], status: [], denoise: [], prefill: [], prefill_done: [] };

function call(cmd, ...args) {
  const id = nextId++;
  return new Promise((resolve) => { pending.set(id, resolve); worker.postMessage({ id, cmd, args }); });
}
worker.onmessage = (ev) => {
  const m = ev.data;
  if (m.event) { (listeners[m.event] || []).forEach((f) => f(m)); return; }
  const resolve = pending.get(m.id);
  pending.delete(m.id);
  if (resolve) resolve(m.result || {});
};
worker.onerror = (ev) => showError("model-error", `The app's worker failed: ${ev.message || ev}`);
const on = (event, f) => listeners[event].push(f);

// ---------------------------------------------------------------- state
const state = {
  chats: loadChats(),   // every conversation (see "conversations" below)
  chat: null,           // the one on screen: an element of chats.chats
  settings: loadJSON(SETTINGS_KEY, {}),
  modelDefaults: {},
  model: null,
  loaded: false,
  busy: false,
  streaming: null,
  loadId: 0,
  streamedTokens: 0,   // tokens of the reply being streamed
  repliesEnded: 0,     // replies generated to their end or their error (what a waiter counts)
  adapterLoaded: false, // the loaded model has a LoRA adapter applied
  training: false,     // a fine-tuning run is going (finetune.js): the engine is the trainer's
  everLoaded: false,   // the chosen model loaded at least once (its button says Reload, else Load)
  loadedWith: null,    // {gpuMemory, f16, promptStep}: the settings the loaded model was loaded with
  loadFailed: false,   // the last load of the chosen model failed (the error is about it)
  webgpu: true,        // false: the browser gives the page no WebGPU device
};
let finetune = null;   // the Fine-tune panel (finetune.js)
let images = null;     // images attached to messages (images.js)
let audio = null;      // audio clips attached to messages (audio.js)
let drafter = null;    // an assistant drafter beside the model (drafter.js)
state.chat = state.chats.chats.find((c) => c.id === state.chats.current);
window.app = { call, state, loadModel, generate };   // for tests and the curious

// "1 token", "2 tokens": every count the page shows goes through here.
function plural(n, one, many = `${one}s`) { return `${n} ${n === 1 ? one : many}`; }
// Bytes for people: 16.9 GiB, 812 MiB, 0.38 MiB, 12 KiB (never "0.00 GiB").
function formatBytes(n) {
  if (n >= 2 ** 30) return `${(n / 2 ** 30).toFixed(n >= 10 * 2 ** 30 ? 1 : 2)} GiB`;
  if (n >= 2 ** 20) return `${(n / 2 ** 20).toFixed(n >= 10 * 2 ** 20 ? 0 : 1)} MiB`;
  if (n >= 1024) return `${Math.round(n / 1024)} KiB`;
  return plural(Math.round(n), "byte");
}
Object.assign(window.app, { plural, formatBytes });

function loadJSON(key, fallback) {
  try { return JSON.parse(localStorage.getItem(key)) ?? fallback; } catch { return fallback; }
}
// touched: what the conversation says changed (its messages, its system prompt): it moves to the top of the list
function saveChat(touched = true) { if (touched) state.chat.updated = Date.now(); saveChats(); }
function saveSettings() { localStorage.setItem(SETTINGS_KEY, JSON.stringify(state.settings)); }
function setState(s) { document.body.dataset.state = s; updateButtons(); }

// An error: plain text, or a worker's result {error, detail}: the words for people, and the technical
// detail (pyapp.explain) folded away under "Technical details".
function showError(where, what) {
  const r = what && typeof what === "object" ? what : { error: what || "" };
  const el = $(where);
  el.textContent = r.error || "";
  if (r.note) {
    const note = document.createElement("div");
    note.className = "error-note";
    note.textContent = r.note;
    el.append(note);
  }
  if (r.detail) {
    const details = document.createElement("details");
    const summary = document.createElement("summary");
    const pre = document.createElement("pre");
    summary.textContent = "Technical details";
    pre.textContent = r.detail;
    details.append(summary, pre);
    el.append(details);
  }
  el.hidden = !r.error;
}
// A file that did not open: the model loaded before, if any, is still there: say so (the error sits
// above the model's info, never under its green "Loaded" line).
function openFailed(r) {
  showError("model-error", { ...r, note: state.loaded && state.model ? `${state.model.name} is still loaded.` : "" });
  state.loadFailed = false;          // the error is about the file, not the chosen model
  setState(state.loaded ? "loaded" : state.webgpu ? "ready" : "no-webgpu");
}

// ---------------------------------------------------------------- layout: the menu and the settings panel
// Wide screens show the sidebar (conversations, models) and the settings beside the chat; narrower ones
// open them over it: the menu button and the Settings button toggle them, Escape or a click outside closes.
const WIDE = window.matchMedia("(min-width: 1101px)");
const NARROW = window.matchMedia("(max-width: 760px)");
function overlayOpen() {
  return (NARROW.matches && document.body.classList.contains("sidebar-open")) ||
    (!WIDE.matches && document.body.classList.contains("settings-open"));
}
function showScrim() { $("scrim").hidden = !overlayOpen(); }
function openSidebar(open) {
  document.body.classList.toggle("sidebar-open", open);
  $("menu-toggle").setAttribute("aria-expanded", String(open));
  if (open && !WIDE.matches) openSettings(false);
  showScrim();
}
function openSettings(open, focus = false) {
  document.body.classList.toggle("settings-open", open);
  $("settings-toggle").setAttribute("aria-expanded", String(open));
  if (open && NARROW.matches) openSidebar(false);
  showScrim();
  if (open && focus) $("settings-h").focus();
}
function closeOverlays() {
  if (NARROW.matches) openSidebar(false);
  if (!WIDE.matches) openSettings(false);
}
openSettings(WIDE.matches);
WIDE.addEventListener("change", () => openSettings(WIDE.matches));
NARROW.addEventListener("change", () => openSidebar(false));
$("menu-toggle").onclick = () => openSidebar(!document.body.classList.contains("sidebar-open"));
$("settings-toggle").onclick = () => openSettings(!document.body.classList.contains("settings-open"), true);
$("settings-close").onclick = () => { openSettings(false); $("settings-toggle").focus(); };
$("sidebar-close").onclick = () => { openSidebar(false); $("menu-toggle").focus(); };
$("scrim").onclick = closeOverlays;
document.addEventListener("keydown", (ev) => {
  if (ev.key === "Escape" && overlayOpen()) { ev.preventDefault(); closeOverlays(); }
});
// The model button (what is loaded, in the header): shows the model picker, a menu on a phone.
$("model-button").onclick = () => {
  if (NARROW.matches) openSidebar(true);
  $("models").scrollIntoView({ block: "start" });
  $("models-h").focus();
};
// The skip link: straight to the message box (the Chat tab, the menus closed).
$("skip-link").onclick = (ev) => {
  ev.preventDefault();
  closeOverlays();
  if (finetune) finetune.showTab("chat");
  $("prompt").focus();
};

// What the header says about the model: its name (name:tag for an Ollama model, else the file's name)
// and where it stands.
function showModelStatus() {
  const m = state.model;
  const loading = document.body.dataset.state === "loading";
  const status = !m ? "none" : loading ? "loading" : state.loaded ? "loaded" : state.loadFailed ? "failed" : "chosen";
  document.body.dataset.model = status;
  $("model-name").textContent = m ? modelLabel(m) : "No model loaded";
  $("model-status").textContent = { none: state.webgpu ? "choose one" : "needs WebGPU", loading: "loading…",
                                    loaded: "loaded", failed: "not loaded", chosen: "not loaded" }[status];
  $("model-button").title = m ? `${m.name} (${m.file})` : "Choose a model";
}
// The header's name of a model: its Ollama name, "Built-in test model" for the page's own, else its file.
function modelLabel(m) {
  const builtIn = m.test_model && state.modelSource && state.modelSource.kind === "demo";
  return m.digest ? m.name : builtIn ? "Built-in test model" : m.file || m.name;
}

// ---------------------------------------------------------------- boot
on("status", (m) => {
  if (state.loaded) return;
  $("gpu").textContent = m.text;
  if (!state.model) $("model-status").textContent = m.text;
});

async function boot() {
  if (!("gpu" in navigator)) {
    $("webgpu-reason").textContent = "This browser has no navigator.gpu.";
    $("webgpu-help").hidden = false;
  }
  const r = await call("boot");
  DEFAULTS = { ...r.defaults, seed: r.defaults.seed ?? "" };
  state.settings = { ...DEFAULTS, ...state.settings };
  state.modelDefaults = { ...DEFAULTS };
  applyRules({ ...(r.rules || {}), ...GPU_MEMORY_RULE });
  showSettings();
  if (r.error) {
    $("gpu").textContent = "No WebGPU";
    $("webgpu-reason").textContent = r.error;
    $("webgpu-help").hidden = false;
    state.webgpu = false;
    setState("no-webgpu");
    return;
  }
  state.adapter = r.adapter;
  state.gpuMemory = loadJSON(GPU_MEMORY_KEY, {})[r.adapter] ?? r.gpu_memory;
  $("gpu_memory").value = state.gpuMemory;
  // f16 tiles need shader-f16: without it the box stays off and says why
  state.promptStep = loadJSON(PROMPT_STEP_KEY, {})[r.adapter] || "";      // "": the model's default
  $("prompt_step").value = state.promptStep;
  state.f16 = !!r.f16 && !!loadJSON(F16_KEY, {})[r.adapter];
  $("f16").checked = state.f16;
  $("f16").disabled = !r.f16;
  if (!r.f16) $("f16-help").textContent = "This GPU has no shader-f16: prompts run in f32 and int8.";
  const mib = (n) => `${Math.round(n / 2 ** 20)} MiB`;
  // a software adapter is named as what it is: the CPU, many times slower than a GPU
  const cpu = r.software ? `<span class="cpu">CPU, no GPU (${escapeHtml(r.software)})</span> · ` : "";
  $("gpu").innerHTML = `${cpu}<strong>${escapeHtml(r.adapter)}</strong> · f16 ${r.f16 ? "yes" : "no"} · subgroups ` +
    `${r.subgroups ? "yes" : "no"} · max buffer ${mib(r.limits.max_buffer_size)} · max binding ` +
    `${mib(r.limits.max_storage_buffer_binding_size)}`;
  $("gpu").title = JSON.stringify(r.limits, null, 1);
  state.software = r.software || null;
  $("cpu-adapter").textContent = r.software || "";
  $("cpu-notice").hidden = !r.software || sessionStorage.getItem("gemma4.cpu_notice_hidden") === "1";
  $("cpu-notice-hide").onclick = () => {
    $("cpu-notice").hidden = true;
    sessionStorage.setItem("gemma4.cpu_notice_hidden", "1");   // the header still says CPU
    $("prompt").focus();
  };
  setState("ready");
  images.prune(state.chats.chats);     // images and clips no conversation holds any more
  audio.prune(state.chats.chats);
  await offerReopen();
}

// ---------------------------------------------------------------- choosing a model
// The chosen model's card; status: its line under it (loaded, or why not).
function describe(m, status = "") {
  const tag = m.test_model ? ' <span class="badge">test model: random weights, it talks nonsense</span>' : "";
  const file = m.digest || m.file === m.name ? "" : `<br><small>${escapeHtml(m.file)}</small>`;
  return `<div class="info"><strong>${escapeHtml(m.name)}</strong>${tag}${file}<br>` +
    `${escapeHtml(m.quantization)} · ${escapeHtml(m.parameter_size)} parameters · ${formatBytes(m.bytes)}<br>` +
    `<small>${escapeHtml(m.config)}</small><br><small class="parts">${escapeHtml(images.takesText(m))}</small>${status}</div>`;
}
// The card with the truth under it: not loaded, and what to do (the error itself sits above the card).
// What the card says the model takes changed (a projector added or removed).
function modelCardChanged(r) {
  if (r && r.audio) audio.modelChosen(r.audio);   // the projector holds an audio encoder, or held one
  const parts = document.querySelector("#model-info .parts");
  if (parts && state.model) parts.textContent = images.takesText(state.model);
}
function showNotLoaded(why) {
  if (!state.model) return;
  $("model-info").innerHTML = describe(state.model, `<div class="not-loaded">Not loaded${why ? `: ${escapeHtml(why)}` : ""}</div>`);
}

async function afterOpen(r, source) {
  if (r.adapter || r.adapter_error) { await afterAdapter(r); return; }   // a dropped LoRA adapter
  if (r.error) { openFailed(r); return; }
  showAdapter(null);          // a new model: the adapter, made for the old one, is forgotten
  if (source) rememberModel(source);
  state.modelSource = source || null;
  showError("model-error", "");
  state.model = r.model;
  audio.modelChosen(r.audio);    // whether it hears audio (before the card says so)
  images.modelChosen(r.images);  // whether it takes images (the projector added for the old one is forgotten)
  drafter.modelChosen();         // a drafter added for the old model is forgotten too
  state.loaded = false;        // the worker dropped the model loaded before
  state.everLoaded = false;
  state.loadFailed = false;
  $("model-info").innerHTML = describe(r.model);
  showDiffusionSettings(r.model);
  state.modelDefaults = { ...DEFAULTS, context_length: Math.min(DEFAULTS.context_length, r.model.context_length || Infinity) };
  if (r.params) applyModelDefaults(r.params);
  if (r.suggested) suggestSettings(r.suggested);
  if (r.system && !state.chat.system) {   // the Ollama manifest's system prompt, for a conversation without one
    state.chat.system = r.system;
    showSettings();
    saveChat(false);
  }
  await showPlan();
  await loadModel();
}

// source: {kind: "file" | "demo", handle}: a file's FileSystemFileHandle, when there is one, is remembered
async function openFile(file, source = { kind: "file" }) {
  if (!file || state.busy) return;
  if (!state.webgpu) {
    showError("model-error", `\u201c${file.name}\u201d cannot be opened here: this browser gives the page no ` +
      "WebGPU device, which the models need (see the message at the top of the page).");
    return;
  }
  setState("opening");
  const r = await call("open_file", file, file.name);
  if (r.drafter_file && state.model && !state.model.denoise) {   // a drafter dropped: for the chosen model
    setState(state.loaded ? "loaded" : "ready");
    await drafter.add(file);
    return;
  }
  await afterOpen(r, { ...source, name: file.name, size: file.size });
}

async function loadModel() {
  state.loaded = false;
  state.busy = true;
  state.loadFailed = false;
  setState("loading");
  showError("model-error", "");
  showNotLoaded("loading…");
  $("load-box").hidden = false;
  $("load-progress").value = 0;
  $("load-text").textContent = "Uploading weights to the GPU…";
  state.loadId += 1;   // cancel names the load it means: a late click cannot cancel the next one
  const r = await call("load", settingNumber(state.settings.context_length, DEFAULTS.context_length), state.loadId,
                       state.gpuMemory, state.f16, state.promptStep);
  state.busy = false;
  $("load-box").hidden = true;
  if (r.error) {
    // the model is not loaded: the card says so, the error above it says why, and Load tries again
    state.loadFailed = true;
    showError("model-error", r);
    showNotLoaded(r.error.includes("cancelled") ? "loading was cancelled" :
      "see the message above; change the settings if it says so, then load it again");
    setState(state.webgpu ? "ready" : "no-webgpu");
    markLoaded();
    finetune.modelLoaded();
    images.modelLoaded(null);
    audio.modelChosen();
    drafter.modelUnloaded();
    return;
  }
  state.loaded = true;
  audio.modelChosen(r.audio);
  images.modelLoaded(r.images);
  drafter.modelLoaded(r.drafter);
  state.everLoaded = true;
  state.loadedWith = { gpuMemory: state.gpuMemory, f16: state.f16, promptStep: state.promptStep };
  contextLoaded(r.context_length);
  showError("chat-error", "");
  $("model-info").innerHTML = describe(r.model,
    `<div class="ok">Loaded in ${r.seconds.toFixed(1)} s · context ${plural(r.context_length, "token")}` +
    ` · prompt steps of up to ${plural(r.prompt_step, "token")}</div>`);
  state.loadedPlan = planHtml(r.plan, r.plan_figures, "On the GPU now");
  $("memory-plan").innerHTML = state.loadedPlan;
  showAdapter(r.adapter);
  state.adapterLoaded = !!r.adapter;
  setState("loaded");
  renderChat();                // the empty conversation's words
  markLoaded();
  finetune.modelLoaded();
  const n = await call("count_tokens", JSON.stringify(templateMessages()));   // a kept conversation counts
  updateMeter({ context_used: n.tokens || 0, context_length: r.context_length });
}

on("progress", (m) => {
  $("load-progress").value = m.total ? m.done / m.total : 0;
  const eta = m.eta >= 0 ? ` · ${Math.ceil(m.eta)} s left` : "";
  $("load-text").textContent = `${(m.done / 2 ** 20).toFixed(1)} / ${(m.total / 2 ** 20).toFixed(1)} MiB${eta}`;
});
// after the upload the GPU compiles the model's programs (seconds; a minute on a CPU rasterizer)
on("compiling", (m) => {
  $("load-progress").value = m.made ? m.done / m.made : 0;
  $("load-text").textContent = `Preparing the GPU programs: ${m.done} / ${m.made}`;
});
$("cancel-load").onclick = () => call("cancel_load", state.loadId);
$("reload-model").onclick = () => { if (!state.busy) loadModel(); };

$("file-input").onchange = (ev) => { openFile(ev.target.files[0]); ev.target.value = ""; };
const dropZones = () => [$("drop"), $("ft-drop")];
window.addEventListener("dragover", (ev) => { ev.preventDefault(); dropZones().forEach((z) => z.classList.add("over")); });
window.addEventListener("dragleave", () => dropZones().forEach((z) => z.classList.remove("over")));
window.addEventListener("drop", (ev) => {
  ev.preventDefault();
  dropZones().forEach((z) => z.classList.remove("over"));
  const file = ev.dataTransfer && ev.dataTransfer.files[0];
  if (finetune.isDataFile(file)) { finetune.chooseData(file); return; }   // training data: the Fine-tune panel
  if (images.isImage(file)) { images.attachFiles(ev.dataTransfer.files); return; }   // images: the next message
  if (audio.isAudio(file)) { audio.attachFiles(ev.dataTransfer.files); return; }     // audio too
  const handle = droppedHandle(ev.dataTransfer);   // asked for now: a drop's data is gone after an await
  if (file) handle.then((h) => openFile(file, { kind: "file", handle: h }));
});

// ---------------------------------------------------------------- LoRA adapter
// Python checks the adapter against the chosen model; it is applied from the next load (so the loaded
// model is reloaded), and the switch and the scale then change it between replies without a reload.
// keepInputs: leave the switch and the scale as they are (the answer to a change may arrive while the
// user, or a test, is already typing the next value)
function showAdapter(a, keepInputs = false) {
  $("adapter-controls").hidden = !a;
  const [first, ...targets] = a ? a.lines : [];
  $("adapter-info").innerHTML = a ? `<div class="info">${escapeHtml(first.replace(/^LoRA adapter:\s*/, ""))}` +
    `<details><summary>Adapted tensors</summary>${targets.map(escapeHtml).join("<br>")}</details></div>` : "";
  if (a && !keepInputs) { $("adapter-on").checked = a.on; $("adapter-scale").value = a.scale; }
  showError("adapter-error", "");
}
async function afterAdapter(r) {
  setState(state.loaded ? "loaded" : "ready");
  if (r.error) { showError("adapter-error", r); return; }
  showAdapter(r.adapter);
  if (state.loaded) await loadModel();
}
async function openAdapter(file) {
  if (!file || state.busy || state.streaming !== null || state.training) return;
  setState("opening");
  await afterAdapter(await call("open_adapter", file, file.name));
}
async function adapterSetting() {
  const r = await call("set_adapter", $("adapter-on").checked, $("adapter-scale").value);
  if (r.adapter) showAdapter(r.adapter, true);
  showError("adapter-error", r.error ? r : "");
}
$("open-adapter").onclick = () => $("adapter-input").click();
$("adapter-input").onchange = (ev) => { openAdapter(ev.target.files[0]); ev.target.value = ""; };
$("adapter-on").onchange = adapterSetting;
$("adapter-scale").onchange = adapterSetting;
async function removeAdapter() {
  await call("remove_adapter");
  showAdapter(null);
  state.adapterLoaded = false;
  if (state.loaded) await loadModel();
}
$("remove-adapter").onclick = () => { if (!state.busy && state.streaming === null && !state.training) removeAdapter(); };

$("demo").onclick = async () => {
  if (state.busy) return;
  setState("opening");
  const res = await fetch("models/demo.gguf");
  if (!res.ok) { showError("model-error", "This build has no demo model"); setState("ready"); return; }
  await openFile(new File([await res.blob()], "demo.gguf"), { kind: "demo" });
};

// Ollama folder: File System Access API; the handle is kept in IndexedDB for next time.
function idb() {
  return new Promise((resolve, reject) => {
    const req = indexedDB.open("gemma4", 1);
    req.onupgradeneeded = () => req.result.createObjectStore("handles");
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error);
  });
}
async function idbDo(mode, f) {
  const db = await idb();
  return new Promise((resolve, reject) => {
    const req = f(db.transaction("handles", mode).objectStore("handles"));
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error);
  });
}

// What IndexedDB remembers: the Ollama folder (a Reopen button) and recent files (a list).
let savedFolder = null;
async function offerReopen() {
  try { savedFolder = await idbDo("readonly", (s) => s.get("ollama")); } catch (e) { /* no IndexedDB (private mode) */ }
  if (savedFolder) {
    $("reopen-folder").textContent = `Reopen the Ollama folder \u201c${savedFolder.name}\u201d`;
    $("reopen-folder").hidden = false;
    $("reopen-folder").onclick = reopenFolder;
  }
  await loadRecent();
}
// A handle kept in IndexedDB must be granted again after a reload: the browser asks, on a click.
async function grantRead(handle, what) {
  const perm = handle.requestPermission ? await handle.requestPermission({ mode: "read" }) : "granted";
  if (perm !== "granted") showError("model-error", `Permission to read ${what} was denied.`);
  return perm === "granted";
}
async function reopenFolder() {
  if (savedFolder && await grantRead(savedFolder, "the folder")) await openFolder(savedFolder);
}

$("open-folder").onclick = async () => {
  let handle;
  try {
    handle = window.__pickDirectory ? await window.__pickDirectory()
                                    : await window.showDirectoryPicker({ id: "ollama-models", mode: "read" });
  } catch (e) {
    if (e.name !== "AbortError") {
      showError("model-error", window.showDirectoryPicker ? `Could not open the folder: ${e.message}` :
        "This browser cannot open folders (File System Access API); use Chrome or Edge, or open a GGUF file.");
    }
    return;
  }
  try { await idbDo("readwrite", (s) => s.put(handle, "ollama")); } catch (e) { /* not persisted */ }
  savedFolder = handle;
  await openFolder(handle);
};

async function openFolder(handle) {
  setState("opening");
  const r = await call("open_folder", handle);
  setState(state.loaded ? "loaded" : "ready");
  if (r.error) { showError("model-error", r); return; }
  showError("model-error", "");
  state.folderModels = r.models;
  state.folderName = r.folder;
  renderFolder();
}
// The folder's models: each a button (Gemma 4 ones), with what it is; one that cannot be used says why in
// plain words beside it (the reader's message folded), never inside a faded button; the loaded one is marked.
function renderFolder() {
  // the models this app runs first, then those it cannot (each with its reason), by name within each
  const models = [...(state.folderModels || [])].sort((a, b) => (b.usable - a.usable) || a.name.localeCompare(b.name));
  $("folder-models").hidden = !state.folderModels;
  $("folder-h").textContent = state.folderName ? `In the Ollama folder \u201c${state.folderName}\u201d` : "In the Ollama folder";
  const list = $("model-list");
  list.replaceChildren();
  if (!models.length) list.innerHTML = "<li>No models in this folder.</li>";
  for (const m of models) {
    const li = document.createElement("li");
    const b = document.createElement("button");
    b.type = "button";
    b.className = "model";
    b.disabled = !m.usable;
    b.dataset.usable = m.usable ? "yes" : "";   // updateButtons keeps an unusable model's button disabled
    const media = (m.parts || []).filter((p) => p !== "text").map((p) => (p === "vision" ? "image" : p));
    const loaded = isLoaded({ digest: m.digest, name: m.name });
    b.innerHTML = `<strong>${escapeHtml(m.name)}</strong>${loaded ? '<span class="loaded-badge">loaded</span>' : ""} ` +
      `<small>${escapeHtml(m.parameters || "")} ${escapeHtml(m.quantization || "")}${m.size ? ` · ${formatBytes(m.size)}` : ""}` +
      `${media.length ? ` · text, ${escapeHtml(media.join(", "))} in the file` : ""}</small>`;
    if (loaded) b.setAttribute("aria-current", "true");
    b.onclick = () => openFolderModel(m.name);
    li.append(b);
    if (!m.usable) {
      const why = document.createElement("div");
      why.className = "why";
      why.id = `why-${list.children.length}`;
      why.textContent = m.why;
      if (m.detail) {
        const details = document.createElement("details");
        const summary = document.createElement("summary");
        summary.textContent = "Technical details";
        const pre = document.createElement("div");
        pre.textContent = m.detail;
        details.append(summary, pre);
        why.append(details);
      }
      b.setAttribute("aria-describedby", why.id);
      li.append(why);
    }
    list.append(li);
  }
  updateButtons();
}
// The lists mark the model loaded now (or no longer).
function markLoaded() {
  if (state.folderModels) renderFolder();
  renderRecent();
}
// Is this the model loaded now? (an Ollama model by its blob's digest and name, a file by its name and size)
function isLoaded(x) {
  const m = state.model;
  if (!state.loaded || !m) return false;
  if (x.digest || m.digest) return !!x.digest && x.digest === m.digest && (!x.name || x.name === m.name);
  return x.file === m.file && (x.size === undefined || !state.modelSource || state.modelSource.size === x.size);
}

async function openFolderModel(name) {
  if (state.busy) return;
  setState("opening");
  await afterOpen(await call("open_folder_model", name), { kind: "ollama", name });
}

// ---------------------------------------------------------------- settings
function readSettings() {
  for (const k of PARAMS) if (checkSetting(k)) state.settings[k] = $(k).value;   // a bad value is not used
  const touched = state.chat.system !== $("system").value && state.chat.messages.length > 0;
  state.chat.system = $("system").value;
  state.chat.thinking = $("thinking").checked;
  saveSettings();
  saveChat(touched);
}
function showSettings() {
  for (const k of PARAMS) $(k).value = state.settings[k] ?? "";
  PARAMS.forEach(checkSetting);   // the values shown are good ones: clear any message
  $("system").value = state.chat.system || "";
  $("thinking").checked = !!state.chat.thinking;
  contextNote();                  // the note follows the field
}
function applyModelDefaults(p) {
  state.modelDefaults = { ...DEFAULTS, ...Object.fromEntries(Object.entries(p).filter(([, v]) => v !== null)) };
  if (p.num_ctx) state.modelDefaults.context_length = Math.min(p.num_ctx, 32768);
  if (state.model && state.model.context_length) {     // never more than the model takes
    state.modelDefaults.context_length = Math.min(state.modelDefaults.context_length, state.model.context_length);
  }
  state.settings = { ...state.modelDefaults };
  showSettings();
  saveSettings();
}
// A test model suggests a setting or two of its own (short replies): only those change.
function suggestSettings(suggested) {
  Object.assign(state.modelDefaults, suggested);
  Object.assign(state.settings, suggested);
  showSettings();
  saveSettings();
}
for (const k of [...PARAMS, "system", "thinking"]) $(k).addEventListener("change", readSettings);
// Model defaults: every field good again, so Send is free and the notes follow the fields.
$("reset-settings").onclick = () => {
  state.settings = { ...state.modelDefaults };
  showSettings();
  saveSettings();
  settingsChanged();
};

// ---------------------------------------------------------------- the memory plan
// What loading puts on the GPU and what stays in the file (pyapp.runtime.memory): before loading, for the
// settings as they are; after loading, what the GPU holds.
async function showPlan() {
  const ctx = settingNumber(state.settings.context_length, DEFAULTS.context_length);
  const p = await call("memory_plan", ctx, state.gpuMemory, state.promptStep);
  const title = state.loaded ? "After a reload with these settings" : "Loading it would take";
  $("memory-plan").innerHTML = p.error ? `<div class="error">${escapeHtml(p.error)}</div>` : planHtml(p.lines, p, title);
}
// The plan: a title, the bar and its legend, and its lines folded under the first (the total and the budget).
function planHtml(lines, p, title) {
  const [first, ...rest] = (lines || []).map((l) => escapeHtml(l.trim()));
  return `<p class="plan-head">${escapeHtml(title)}</p>` + (p ? planBar(p) : "") +
    `<details class="plan-details"><summary>${first || "Details"}</summary>` +
    `<ul class="plan">${rest.map((l) => `<li>${l}</li>`).join("")}</ul></details>`;
}
// One bar, to scale, with its legend: the weights, the experts (all, or their cache), the activations and KV
// cache (all on the GPU), an assistant drafter loaded beside the model, and what stays in the file and is read
// as needed.
function planBar(p) {
  const experts = p.n_experts ? `experts (all ${p.n_experts} per layer)` : "experts";
  const parts = [["resident", "weights on the GPU", p.weights], ["experts", `${experts} on the GPU`, p.experts],
                 ["cache", `expert cache on the GPU (${p.slots} of ${p.n_experts} per layer)`, p.expert_cache],
                 ["state", "activations and KV cache", p.state],
                 ["drafter", "assistant drafter on the GPU", p.drafter],
                 ["file", "left in the file, read as needed", p.in_file]].filter(([, , n]) => n > 0);
  const total = parts.reduce((a, [, , n]) => a + n, 0) || 1;
  let x = 0;
  const rects = parts.map(([cls, name, n]) => {
    const w = Math.max(1, (300 * n) / total);
    const r = `<rect class="${cls}" x="${x.toFixed(1)}" y="0" width="${w.toFixed(1)}" height="14">` +
      `<title>${name}: ${formatBytes(n)}</title></rect>`;
    x += w;
    return r;
  });
  const label = parts.map(([, name, n]) => `${name} ${formatBytes(n)}`).join(", ");
  const legend = parts.map(([cls, name, n]) =>
    `<li><span class="swatch ${cls}" aria-hidden="true"></span>${escapeHtml(name)}: ${formatBytes(n)}</li>`).join("");
  return `<svg class="plan-bar" viewBox="0 0 ${Math.ceil(x)} 14" width="300" height="14" role="img" ` +
    `aria-label="${escapeHtml(label)}">${rects.join("")}</svg><ul class="plan-legend" aria-hidden="true">${legend}</ul>`;
}
// A setting that sizes the loaded model (GPU memory, prompt step, f16 tiles, context) changed: the plan for it, a stale
// load error gone (it was about the old settings), and Load / Reload offered.
async function settingsChanged() {
  contextNote();
  if (state.loadFailed && !state.busy) {
    state.loadFailed = false;
    showError("model-error", "");
    showNotLoaded("the settings changed since it failed: load it to try them");
  }
  updateButtons();
  if (!state.model || state.busy) return;
  if (!state.loaded || reloadWanted()) await showPlan();
  else if (state.loadedPlan) $("memory-plan").innerHTML = state.loadedPlan;   // as loaded again
}
// GPU memory, the prompt step and f16 tiles are properties of the GPU, not of a model: kept per adapter.
function rememberForThisGpu(key, value) {
  const saved = loadJSON(key, {});
  saved[state.adapter] = value;
  localStorage.setItem(key, JSON.stringify(saved));
}
$("prompt_step").addEventListener("change", () => {
  state.promptStep = $("prompt_step").value;
  rememberForThisGpu(PROMPT_STEP_KEY, state.promptStep);
  settingsChanged();                      // the loaded model keeps its steps until reloaded
});
$("f16").addEventListener("change", () => {
  state.f16 = $("f16").checked;
  rememberForThisGpu(F16_KEY, state.f16);
  settingsChanged();                      // the loaded model keeps its tiles until reloaded
});
$("gpu_memory").addEventListener("change", async () => {
  if (!checkSetting("gpu_memory")) return;   // a bad value is not used (its message says why)
  state.gpuMemory = settingNumber($("gpu_memory").value, 0);
  rememberForThisGpu(GPU_MEMORY_KEY, state.gpuMemory);
  await settingsChanged();                // the loaded model keeps its old plan until reloaded
});
$("gpu_memory").addEventListener("input", () => checkSetting("gpu_memory"));
// GPU memory is the page's own setting (not the sampler's): its rule is here.
const GPU_MEMORY_RULE = { gpu_memory: { min: 0, max: null, lo: 0, above_lo: false, integer: false, special: null,
  rule: "a number, 0 or more (0 puts the whole model on the GPU)" } };

// Each setting's bounds come from Python (pyapp.sampling.RULES), which also checks what is sent:
// a value out of range comes back as an error naming the setting, never silently changed here.
function applyRules(rules) {
  for (const [k, r] of Object.entries(rules)) {
    const el = $(k);
    if (!el) continue;
    el.min = r.min;
    if (r.max != null) el.max = r.max;   // Python's None arrives as undefined
    el.title = r.rule;
  }
  addSettingChecks(rules);
}
// A setting's number; an empty field means the default.
function settingNumber(v, d) {
  return v === "" || v === null || v === undefined ? d : Number(v);
}

// ---------------------------------------------------------------- checking settings
// Each number setting is checked as pyapp.sampling's Rule.check does, with the rules the worker sends
// at boot. A bad value gets a message beside its field (its <details> opens) and is not used: the
// last good one stays in state.settings, and Send waits until every field is good.
let RULES = {};
function addSettingChecks(rules) {   // called again with more rules (the Fine-tune panel's fields)
  RULES = { ...RULES, ...rules };
  for (const k of Object.keys(rules)) {
    const el = $(k);
    if (!el || $(`${k}-problem`)) continue;
    const msg = document.createElement("span");
    msg.className = "field-error";
    msg.id = `${k}-problem`;
    msg.hidden = true;
    el.after(msg);
    el.setAttribute("aria-describedby", `${(el.getAttribute("aria-describedby") || "")} ${msg.id}`.trim());
  }
  PARAMS.forEach(checkSetting);
}
// What is wrong with a field's value ("" when nothing; an empty field means the default).
function settingProblem(k) {
  const el = $(k), r = RULES[k];
  if (!r) return "";
  if (el.validity.badInput) return "must be a number";
  if (el.value === "") return "";
  const v = Number(el.value);
  const inRange = (r.above_lo ? v > r.lo : v >= r.lo) && (r.max == null || v <= r.max);   // None: undefined
  const ok = Number.isFinite(v) && (!r.integer || Number.isInteger(v)) && (v === r.special || inRange);
  return ok ? "" : `must be ${r.rule}`;
}
function checkSetting(k) {
  const problem = settingProblem(k);
  const el = $(k), msg = $(`${k}-problem`);
  if (!msg) return !problem;
  const name = el.closest("label").firstChild.textContent.trim();
  msg.textContent = problem ? `${name} ${problem}.` : "";
  msg.hidden = !problem;
  if (problem) el.setAttribute("aria-invalid", "true"); else el.removeAttribute("aria-invalid");
  const section = el.closest("details");
  if (problem && section) section.open = true;
  return !problem;
}
function settingsValid() { return PARAMS.every((k) => !settingProblem(k)); }
for (const k of PARAMS) $(k).addEventListener("input", () => { checkSetting(k); updateButtons(); });

// ---------------------------------------------------------------- context length vs the loaded model
// The KV cache is sized when the model loads, at most to the context the model was trained for: the
// note under the settings says when the field asks for more than that, or for a size that needs a
// reload, so the field never disagrees silently with the loaded model.
function contextNote() {
  const asked = settingNumber(state.settings.context_length, DEFAULTS.context_length);
  const max = state.model ? state.model.context_length : 0;
  const wanted = max ? Math.min(asked, max) : asked;
  const notes = [];
  if (max && asked > max) notes.push(`This model takes at most ${max} tokens of context.`);
  if (contextDiffers()) {
    notes.push(`The model is loaded with ${plural(state.loadedContext, "token")} of context: reload it to use ${wanted}.`);
  }
  showContextNote(notes.join(" "));
}
// A setting the loaded model was loaded with (GPU memory, prompt step, f16 tiles, context) differs now: a reload applies it.
function reloadWanted() {
  const w = state.loadedWith;
  return !!(state.loaded && w && (w.gpuMemory !== state.gpuMemory || w.f16 !== state.f16 ||
                                  w.promptStep !== state.promptStep || contextDiffers()));
}
// The context field asks for another size than the loaded model's KV cache holds.
function contextDiffers() {
  const asked = settingNumber(state.settings.context_length, DEFAULTS.context_length);
  const max = state.model ? state.model.context_length : 0;
  return !!(state.loaded && state.loadedContext && (max ? Math.min(asked, max) : asked) !== state.loadedContext);
}
// After a load: the field shows the context the model got (a model caps it at its own).
function contextLoaded(n) {
  state.loadedContext = n;
  if (settingNumber(state.settings.context_length, DEFAULTS.context_length) === n) { showContextNote(""); return; }
  state.settings.context_length = n;
  $("context_length").value = n;
  saveSettings();
  showContextNote(`Context set to ${plural(n, "token")}, the most this model takes.`);
}
function showContextNote(text) {
  $("context-note").textContent = text;
  $("context-note").hidden = !text;
}
$("context_length").addEventListener("change", () => settingsChanged());

function samplingParams() {
  const s = state.settings;
  const num = settingNumber;
  return {
    temperature: num(s.temperature, DEFAULTS.temperature), top_k: num(s.top_k, DEFAULTS.top_k),
    top_p: num(s.top_p, DEFAULTS.top_p), min_p: num(s.min_p, DEFAULTS.min_p),
    repeat_penalty: num(s.repeat_penalty, DEFAULTS.repeat_penalty),
    seed: num(s.seed, null), max_tokens: num(s.max_tokens, DEFAULTS.max_tokens),
    thinking: !!state.chat.thinking && !(state.model && state.model.denoise),   // DiffusionGemma: no thinking mode
    speculate: num(s.speculate, DEFAULTS.speculate),
    ...denoiseSettings(),
  };
}

// ---------------------------------------------------------------- chat
function templateMessages(messages = state.chat.messages) {
  const head = state.chat.system ? [{ role: "system", content: state.chat.system }] : [];
  return head.concat(messages.map(sentMessage));
}
// A reply goes back with the token ids it was generated as (and their vocabulary): the worker builds
// the next prompt from them, so the KV cache that holds them is reused (pyapp.chat.reply_ids).
// A message with images or audio sends its content as parts: each image, then each clip, by the key the worker
// gave it, then the text.
function sentMessage(m) {
  const inputs = [...images.parts(m), ...audio.parts(m)];
  const text = m.content ? [{ type: "text", text: m.content }] : [];
  if (inputs.length) return { role: m.role, content: [...inputs, ...text] };
  return m.ids ? { role: m.role, content: m.content, ids: m.ids, vocab: m.vocab } : { role: m.role, content: m.content };
}

// A message: an article headed by its author ("You" or the model), so a screen reader tells them apart.
function messageEl(m, i) {
  const div = document.createElement("article");
  div.className = `msg ${m.role}`;
  div.dataset.index = i;
  const author = document.createElement("h3");
  author.className = "author";
  author.id = `msg-${i}-author`;
  author.textContent = m.role === "assistant" ? "Gemma" : "You";
  div.setAttribute("aria-labelledby", author.id);
  const body = document.createElement("div");
  body.className = "body";
  if (m.role === "assistant") {
    body.innerHTML = renderReply(m.content || "");
    if (!body.textContent.trim() && !state.streaming) {   // only markers, or nothing: say so, never a blank bubble
      body.innerHTML = '<p class="empty">(no text: the reply held only control markers)</p>';
    }
  } else {
    body.textContent = m.content;
  }
  const meta = document.createElement("div");
  meta.className = "meta";
  if (m.stats && m.stats.denoise) {
    meta.textContent = denoiseStatsText(m.stats);
  } else if (m.stats) {
    const s = m.stats;
    meta.textContent = `${plural(s.tokens, "token")} · ${s.decode_tps.toFixed(1)} tok/s · prefill ${s.prefill_s.toFixed(2)} s` +
      ` (${plural(s.evaluated, "new prompt token")})${s.drafted ? ` · ${s.accepted} of ${plural(s.drafted, "draft")} accepted` : ""}` +
      `${s.stop_reason === "cancelled" ? " · stopped" : ""}` +
      `${s.stop_reason === "length" ? " · max tokens reached" : ""}${s.stop_reason === "context" ? " · context full" : ""}` +
      `${s.adapter ? ` · adapter ${s.adapter.name}${s.adapter.scale !== 1 ? ` at ${s.adapter.scale}` : ""}` : ""}`;
  }
  const copy = document.createElement("button");
  copy.type = "button";
  copy.className = "copy";
  copy.textContent = "Copy";
  copy.setAttribute("aria-label", m.role === "assistant" ? "Copy this reply" : "Copy this message");
  copy.onclick = () => copyText(m.role === "assistant" ? replyAnswer(m.content) : m.content, copy);
  meta.append(copy);
  if (m.role === "user") meta.append(editButton(i));
  div.append(author);
  if (m.images && m.images.length) div.append(images.messageImages(m));   // your images and clips, then your words
  if (m.audio && m.audio.length) div.append(audio.messageAudio(m));
  div.append(body, meta);
  return div;
}
// Copy, and say so: the clipboard API where the page has it, else the browser's copy command on a hidden
// field; where both fail, the words say how to copy by hand.
async function copyText(text, btn) {
  let ok = false;
  try {
    if (navigator.clipboard && navigator.clipboard.writeText) { await navigator.clipboard.writeText(text); ok = true; }
  } catch (e) { /* denied: try the other way */ }
  if (!ok) {
    const area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.className = "visually-hidden";
    document.body.append(area);
    area.select();
    try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
    area.remove();
    btn.focus();
  }
  const said = btn.parentElement.querySelector(".copied") || document.createElement("span");
  said.className = "copied";
  said.setAttribute("role", "status");
  said.textContent = ok ? "Copied" : "Could not copy: select the text and press Ctrl+C (⌘C)";
  btn.after(said);
  clearTimeout(btn.copiedTimer);
  btn.copiedTimer = setTimeout(() => said.remove(), ok ? 2500 : 8000);
}

// ---------------------------------------------------------------- reply channels
// A reply's text keeps Gemma 4's channel markers as the tokenizer spells them (control tokens and
// <unusedN> placeholders never reach it): "<|channel>thought\n…<channel|>" is thinking and
// "<|tool_call>…<tool_call|>" a tool call, in which '<|"|>' quotes strings. Each becomes a folded part;
// a marker out of place (a close without an open, as random weights emit) is dropped, never shown.
const CHANNELS = { "<|channel>": ["<channel|>", "thought"], "<|tool_call>": ["<tool_call|>", "tool_call"] };
const MARKERS = /<\|channel>|<channel\|>|<\|tool_call>|<tool_call\|>|<\|tool_response>|<tool_response\|>|<\|"\|>/g;

// [{kind: "text" | "thought" | "tool_call", text, done}] in order; done false: still streaming
function replyParts(text) {
  const parts = [];
  let open = null;   // the channel being read: {kind, close, text}
  let answer = "";
  const flushAnswer = () => { if (answer) parts.push({ kind: "text", text: answer, done: true }); answer = ""; };
  const put = (s) => { if (open) open.text += s; else answer += s; };
  let last = 0;
  for (const m of text.matchAll(MARKERS)) {
    put(text.slice(last, m.index));
    last = m.index + m[0].length;
    if (m[0] === '<|"|>') put('"');
    else if (!open && CHANNELS[m[0]]) { flushAnswer(); open = { kind: CHANNELS[m[0]][1], close: CHANNELS[m[0]][0], text: "" }; }
    else if (open && m[0] === open.close) { parts.push({ kind: open.kind, text: open.text, done: true }); open = null; }
  }
  put(text.slice(last));
  flushAnswer();
  if (open) parts.push({ kind: open.kind, text: open.text, done: false });
  for (const p of parts) if (p.kind === "thought") p.text = p.text.replace(/^thought\n?/, "");
  return parts;
}
function replyAnswer(text) {
  return replyParts(text).filter((p) => p.kind === "text").map((p) => p.text).join("").trim();
}

function renderReply(text) {
  return replyParts(text).map((p) => {
    if (p.kind === "text") return p.text.trim() ? renderMarkdown(p.text) : "";
    if (p.kind === "thought") {
      return `<details class="thought"${p.done ? "" : " open"}><summary>${p.done ? "Thought" : "Thinking…"}` +
        `</summary>${renderMarkdown(p.text.trim())}</details>`;
    }
    const name = (p.text.match(/^call:([\w.-]+)/) || [])[1];
    return `<details class="tool-call"><summary>${p.done ? "Tool call" : "Calling a tool…"}` +
      `${name ? `: ${escapeHtml(name)}` : ""}</summary><pre><code>${escapeHtml(p.text)}</code></pre></details>`;
  }).join("");
}
Object.assign(window.app, { renderReply, renderChat });   // tests render crafted replies, changed lists

function renderChat() {
  const box = $("messages");
  box.innerHTML = "";
  state.chat.messages.forEach((m, i) => box.append(messageEl(m, i)));
  if (!state.chat.messages.length) {
    const p = document.createElement("p");
    p.className = "empty";
    p.textContent = state.loaded ? `${modelLabel(state.model)} is loaded: say hello. ` +
      "Conversations are kept in this browser only."
      : "Choose a model (the model button at the top), then say hello. Conversations are kept in this browser only.";
    box.append(p);
  }
  box.scrollTop = box.scrollHeight;
  renderChatList();
  drawSpeed();
  updateButtons();
}

function updateButtons() {
  const gen = state.streaming !== null;
  const busy = state.busy || state.training;   // a fine-tuning run has the model until it ends
  const msgs = state.chat.messages;
  const valid = settingsValid();
  $("send").disabled = !state.loaded || gen || busy || !valid || (images && images.busy()) || (audio && audio.busy());
  $("stop").disabled = !gen;
  $("regen").disabled = !state.loaded || gen || busy || !msgs.length || !valid;   // also answers an unanswered message
  $("edit").disabled = gen || !msgs.some((m) => m.role === "user");
  $("new-chat").disabled = gen;
  const noGpu = !state.webgpu;                 // no WebGPU: no model can run, so none can be chosen
  for (const id of ["demo", "open-folder", "open-file", "file-input"]) $(id).disabled = gen || busy || noGpu;
  for (const id of ["open-adapter", "adapter-on", "adapter-scale", "remove-adapter", "reload-model"]) {
    $(id).disabled = gen || busy;
  }
  $("needs-webgpu").hidden = !noGpu;
  $("drop").hidden = noGpu;
  // Load / Reload: whenever the chosen model is not loaded (a failure, a cancel, a lost device), or a
  // setting it was loaded with changed
  const offer = !!state.model && !state.busy && state.webgpu &&
    (!state.loaded || reloadWanted());
  $("reload-model").hidden = !offer;
  $("reload-model").textContent = state.loaded || state.everLoaded ? "Reload the model" : "Load the model";
  for (const b of document.querySelectorAll("#chat-list button, .msg .edit-msg")) b.disabled = gen;
  for (const b of document.querySelectorAll("#recent-list button")) b.disabled = gen || busy || noGpu;
  for (const b of document.querySelectorAll("#model-list button.model")) b.disabled = !b.dataset.usable || gen || busy;
  $("messages").setAttribute("aria-busy", String(gen));   // screen readers read the reply once, when it is done
  composerHint(valid);
  if (images) images.render();
  if (audio) audio.render();
  if (drafter) drafter.render();
  showModelStatus();
  updateReopenNotice();
  if (finetune) finetune.update();
}
// Why Send waits, where it would not be obvious: a setting out of range (maybe in a closed panel).
function composerHint(valid) {
  const hint = $("composer-hint");
  const bad = valid ? null : PARAMS.find((k) => settingProblem(k));
  const text = bad ? `Send waits: ${$(`${bad}-problem`) ? $(`${bad}-problem`).textContent : "a setting is not valid."}` : "";
  if (hint.dataset.text === text) return;      // unchanged: leave the live region quiet
  hint.dataset.text = text;
  hint.textContent = text;
  if (!bad) return;
  const fix = button("Show the setting", "fix-setting", () => {
    openSettings(true);
    const section = $(bad).closest("details");
    if (section) section.open = true;
    $(bad).focus();
  });
  hint.append(" ", fix);
}

function updateMeter(r) {
  const used = r ? r.context_used : 0;
  const total = r ? r.context_length : Number(state.settings.context_length) || DEFAULTS.context_length;
  $("ctx-meter").value = total ? used / total : 0;
  // a kept conversation can outgrow a context loaded smaller since: said here, before Send refuses it
  const over = total > 0 && used >= total;
  $("ctx-text").textContent = `${used} / ${total} tokens${over ? ": more than the context holds" : ""}`;
  $("ctx-text").classList.toggle("over", over);
}

let pendingRender = false;
on("token", (m) => {
  if (state.streaming === null) return;
  if (prefill.timer) endPrefill();
  state.streaming.content += m.text;
  state.streamedTokens += 1;
  if (!pendingRender) {
    pendingRender = true;
    requestAnimationFrame(() => {
      pendingRender = false;
      const el = document.querySelector(".msg.streaming .body");
      if (el && state.streaming) el.innerHTML = renderReply(state.streaming.content);
      $("messages").scrollTop = $("messages").scrollHeight;
    });
  }
});

// Live feedback while a reply streams: its token count and speed so far, and the context meter
// (each token event carries the worker's figures: pyapp.webapp._token_events).
on("token", (m) => {
  if (state.streaming === null || !m.tokens) return;
  showLiveStats(m);
  updateMeter(m);
});
function showLiveStats(m) {
  const meta = document.querySelector(".msg.streaming .meta");
  if (!meta) return;
  let line = meta.querySelector(".live-stats");
  if (!line) {
    line = document.createElement("span");
    line.className = "live-stats";
    meta.prepend(line);
  }
  line.textContent = plural(m.tokens, "token") + (m.tps ? ` · ${m.tps.toFixed(1)} tok/s` : "");
}

// Before the first token: the prompt the model reads first (the worker's "prefill" event: its new tokens, and
// the time that takes at this model's measured rate), with the seconds so far; the context meter moves to it.
// A prompt longer than one chunk (512 tokens) also reports the tokens read after each chunk ("prefill_done").
const prefill = { timer: null, t0: 0, m: null, done: 0 };
on("prefill", (m) => {
  if (state.streaming === null) return;
  prefill.m = m;
  prefill.t0 = performance.now();
  prefill.done = 0;
  updateMeter(m);
  drawPrefill();
  clearInterval(prefill.timer);
  prefill.timer = setInterval(drawPrefill, 500);
});
on("prefill_done", (m) => {
  if (state.streaming === null || !prefill.m) return;
  prefill.done = m.done;
  drawPrefill();
});
// The streaming reply's box for what is read before its first token (the prompt, the images): made once.
function prefillBox(msg, label) {
  let box = msg.querySelector(".prefill");
  if (!box) {
    box = document.createElement("div");
    box.className = "prefill";
    box.innerHTML = '<span class="prefill-text"></span><progress max="1"></progress>';
    msg.querySelector(".body").before(box);
  }
  box.querySelector("progress").setAttribute("aria-label", label);
  return box;
}
function drawPrefill() {
  const msg = document.querySelector(".msg.streaming");
  const m = prefill.m;
  if (!msg || !m || state.streamedTokens > 0 || state.denoiseSteps > 0) { endPrefill(); return; }
  const box = prefillBox(msg, "Reading the prompt");
  const secs = (performance.now() - prefill.t0) / 1000;
  const bar = box.querySelector("progress");
  let left;
  if (prefill.done > 0) {                      // tokens read so far: the rate of this very prompt
    bar.value = prefill.done / m.tokens;
    const rest = (secs / prefill.done) * (m.tokens - prefill.done);
    left = `${prefill.done} of ${m.tokens} read · about ${Math.max(1, Math.ceil(rest))} s left`;
  } else if (m.eta >= 0) {
    const fraction = Math.min(0.99, secs / Math.max(m.eta, 0.1));
    bar.value = fraction;
    left = secs < m.eta ? `about ${Math.ceil(m.eta - secs)} s left` : "taking longer than the last reply's rate";
  } else {
    bar.removeAttribute("value");              // no estimate yet: the bar shows work without a figure
    left = m.denoise ? "then each block is written in steps" :
      state.software ? "the first reply also prepares the GPU programs, which on the CPU can take a minute or two"
                     : "the first reply also prepares the GPU programs";
  }
  box.querySelector(".prefill-text").textContent = `Reading the prompt: ${plural(m.tokens, "token")}` +
    `${m.tokens !== m.prompt_tokens ? ` (${m.prompt_tokens - m.tokens} already read)` : ""} · ${Math.floor(secs)} s so far · ${left}`;
  box.dataset.tokens = m.tokens;
  box.dataset.done = prefill.done;
}
function endPrefill() {
  clearInterval(prefill.timer);
  prefill.timer = null;
  const box = document.querySelector(".msg .prefill");
  if (box) box.remove();
}

// An error under the conversation, with Try again when retry is given.
function showChatError(r, retry) {
  showError("chat-error", r);
  if (!retry) return;
  const again = button("Try again", "retry", () => { showError("chat-error", ""); retry(); });
  $("chat-error").append(" ", again);
}
// The conversation's images and clips the worker has not encoded since the model loaded (a new message's, or
// those of a conversation reopened or kept over a reload), encoded now; the streaming reply says so meanwhile.
async function addInputs(history) {
  const say = (label) => (text) => {
    const msg = document.querySelector(".msg.streaming");
    if (msg) prefillBox(msg, label).querySelector(".prefill-text").textContent = text;
  };
  for (const [kind, label] of [[images, "Reading the images"], [audio, "Preparing audio"]]) {
    const entries = kind.entriesOf(history);
    const r = entries.length ? await kind.ensureAdded(entries, say(label)) : null;
    if (r) return r;
  }
  return null;
}

// The next reply. Returns {imageError} when the conversation's images could not be given to the model.
async function generate() {
  if (!settingsValid()) { updateButtons(); return {}; }   // a setting marked invalid is never silently replaced
  readSettings();
  const history = state.chat.messages.slice();
  const reply = { role: "assistant", content: "" };
  state.streaming = reply;
  state.streamedTokens = 0;
  state.chat.messages.push(reply);
  renderChat();
  const last = $("messages").lastElementChild;
  last.classList.add("streaming");
  setState("generating");
  showError("chat-error", "");
  state.denoiseSteps = 0;
  const ask = () => call("chat", JSON.stringify(templateMessages(history)), JSON.stringify(samplingParams()));
  let r = await addInputs(history);
  let imageError = !!r;            // the images or clips could not be given to the model
  if (!r) {
    r = await ask();
    const lost = [...(r.missing_images || []), ...(r.missing_clips || [])];
    if (lost.length) {             // the worker lost them (a reload, another model): once more
      images.forget(lost);
      audio.forget(lost);
      r = await addInputs(history);
      imageError = !!r;
      if (!r) r = await ask();
    }
    if (r.missing_images || r.missing_clips) imageError = true;
  }
  state.streaming = null;
  endPrefill();
  if (r.error) {
    state.chat.messages.pop();   // keep the user's message; drop the empty reply
    showChatError(r, imageError && !r.device_lost ? () => { if (!$("regen").disabled) generate(); } : null);
    if (r.device_lost) {         // the model is gone with the device: offer to load it again
      state.loaded = false;
      showNotLoaded("the GPU device was lost: reload it");
      saveChat();
      renderChat();
      setState("ready");
      markLoaded();
      images.modelLoaded(null);
      audio.modelChosen();
      drafter.modelUnloaded();
      state.repliesEnded += 1;
      return { imageError };
    }
  } else {
    reply.content = r.text;
    Object.assign(reply, { ids: r.ids, vocab: r.vocab });
    reply.stats = { tokens: r.tokens, decode_tps: r.decode_tps, prefill_s: r.prefill_s, evaluated: r.evaluated,
                    stop_reason: r.stop_reason, drafted: r.drafted || 0, accepted: r.accepted || 0,
                    adapter: r.adapter || null };
    if (r.denoise) reply.stats.denoise = r.denoise;   // a DiffusionGemma reply: its steps and blocks
    updateMeter(r);
  }
  saveChat();
  renderChat();
  state.repliesEnded += 1;
  setState("loaded");
  return { imageError: imageError && !!r.error, result: r };
}

$("composer").onsubmit = async (ev) => {
  ev.preventDefault();
  const text = $("prompt").value.trim();
  const attached = images.attached().slice();
  const clips = audio.attached().slice();
  if ((!text && !attached.length && !clips.length) || $("send").disabled) return;
  $("prompt").value = "";
  images.clearAttached();
  audio.clearAttached();
  const msg = { role: "user", content: text, ...(attached.length ? { images: attached } : {}),
                ...(clips.length ? { audio: clips } : {}) };
  state.chat.messages.push(msg);
  const r = await generate();
  const msgs = state.chat.messages;
  if (r.imageError && msgs[msgs.length - 1] === msg && (attached.length || clips.length)) {
    // its images or clips could not be read: the message goes back to the message box as it was, with them
    msgs.pop();
    saveChat();
    renderChat();
    if (!$("prompt").value) $("prompt").value = text;
    images.restoreAttached(attached);
    audio.restoreAttached(clips);
    showChatError(r.result, () => $("composer").requestSubmit());
  }
};
$("prompt").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("composer").requestSubmit(); }
});
$("stop").onclick = () => call("stop");
$("regen").onclick = async () => {
  if ($("regen").disabled) return;
  const msgs = state.chat.messages;
  if (msgs.length && msgs[msgs.length - 1].role === "assistant") msgs.pop();
  await generate();
};
// Edit last: the last message of yours, edited in place like Edit on it (Cancel keeps everything).
$("edit").onclick = () => {
  const msgs = state.chat.messages;
  const i = msgs.map((m) => m.role).lastIndexOf("user");
  if (i >= 0 && state.streaming === null) startEdit(i);
};

// ---------------------------------------------------------------- conversations
// Every conversation is kept in localStorage (CHATS_KEY), newest first; state.chat is the one on screen.
// New chat keeps the old one, a delete can be undone, and any earlier user message can be edited
// (what came after it is dropped and answered again).
function makeChat(from = {}) {
  const now = Date.now();
  return { id: `${now.toString(36)}-${Math.random().toString(36).slice(2, 8)}`, created: now, updated: now,
           system: from.system || "", thinking: !!from.thinking, messages: from.messages || [] };
}
function loadChats() {
  const saved = loadJSON(CHATS_KEY, null);
  if (saved && Array.isArray(saved.chats) && saved.chats.length) {
    if (!saved.chats.some((c) => c.id === saved.current)) saved.current = saved.chats[0].id;
    return saved;
  }
  const old = loadJSON(CHAT_KEY, null);   // the single conversation of earlier versions becomes the first
  const first = makeChat(old && Array.isArray(old.messages) ? old : {});
  return { current: first.id, chats: [first] };
}
function saveChats() {
  try {
    localStorage.setItem(CHATS_KEY, JSON.stringify(state.chats));
    localStorage.removeItem(CHAT_KEY);   // migrated: the list holds it now
  } catch (e) {
    showError("chat-error", "This browser's storage is full, so the conversation was not saved. " +
      "Delete old conversations to make room.");
  }
}

function chatTitle(chat) {
  const first = chat.messages.find((m) => m.role === "user");
  const text = first ? first.content.replace(/\s+/g, " ").trim() : "";
  if (!text && first && first.images && first.images.length) return plural(first.images.length, "image");
  if (!text && first && first.audio && first.audio.length) return plural(first.audio.length, "audio clip");
  if (!text) return "New chat";
  return text.length > 48 ? `${text.slice(0, 47)}…` : text;
}
function shortDate(ms) {
  const d = new Date(ms);
  return d.toDateString() === new Date().toDateString()
    ? d.toLocaleTimeString(undefined, { hour: "2-digit", minute: "2-digit" })
    : d.toLocaleDateString(undefined, { dateStyle: "medium" });
}
function button(text, className, onclick) {
  const b = document.createElement("button");
  b.type = "button";
  b.className = className;
  b.textContent = text;
  b.onclick = onclick;
  return b;
}

// The conversations, the one changed last first; one with nothing said yet is not listed.
function renderChatList() {
  const shown = state.chats.chats.filter((c) => c.messages.length).sort((a, b) => b.updated - a.updated);
  $("chat-list-empty").hidden = shown.length > 0;
  $("chat-list").replaceChildren(...shown.map((chat) => {
    const li = document.createElement("li");
    const title = document.createElement("span");
    title.className = "title";
    title.textContent = chatTitle(chat);
    const date = document.createElement("small");
    date.textContent = `${shortDate(chat.updated)} · ${plural(chat.messages.length, "message")}`;
    const open = button("", "chat-open", () => selectChat(chat));
    open.append(title, date);
    if (chat === state.chat) open.setAttribute("aria-current", "true");
    const del = button("×", "chat-delete", () => deleteChat(chat));
    del.title = "Delete";
    del.setAttribute("aria-label", `Delete "${chatTitle(chat)}"`);
    li.append(open, del);
    return li;
  }));
}

// Show a conversation: its messages, its system prompt and thinking mode, its share of the context.
async function showChat(chat) {
  state.chat = chat;
  state.chats.current = chat.id;
  saveChats();
  showSettings();
  renderChat();
  const n = state.loaded ? await call("count_tokens", JSON.stringify(templateMessages())) : {};
  updateMeter(n.context_length ? { context_used: n.tokens, context_length: n.context_length } : null);
}
function selectChat(chat) {
  if (chat === state.chat || state.streaming !== null) return;
  if (NARROW.matches) openSidebar(false);   // the menu closes on the conversation chosen
  $("undo-delete").hidden = true;
  // an empty conversation left behind is dropped: New chat and undo never pile them up
  if (!state.chat.messages.length) state.chats.chats = state.chats.chats.filter((c) => c !== state.chat);
  showChat(chat);
}
$("new-chat").onclick = () => {
  if (state.streaming !== null) return;
  if (NARROW.matches) openSidebar(false);
  if (state.chat.messages.length) {
    const chat = makeChat({ system: state.chat.system, thinking: state.chat.thinking });   // settings carry over
    state.chats.chats.unshift(chat);
    selectChat(chat);
  }
  $("prompt").focus();
};

let deleted = null;   // {chat, index, wasCurrent}: the last deleted conversation, until Undo or the next delete
function deleteChat(chat) {
  if (state.streaming !== null) return;
  const list = state.chats.chats;
  const index = list.indexOf(chat);
  list.splice(index, 1);
  deleted = { chat, index, wasCurrent: chat === state.chat };
  if (deleted.wasCurrent) {   // the conversation changed last takes its place (a new one if none is left)
    const next = list.filter((c) => c.messages.length).sort((a, b) => b.updated - a.updated)[0];
    if (!next) list.unshift(makeChat({ system: chat.system, thinking: chat.thinking }));
    showChat(next || list[0]);
  } else {
    saveChats();
    renderChatList();
    updateButtons();
  }
  $("undo-text").textContent = `Deleted "${chatTitle(chat)}".`;
  $("undo-delete").hidden = false;
  $("undo-button").focus();   // the focused Delete button is gone: keyboard users land on Undo
}
$("undo-button").onclick = () => {
  if (!deleted || state.streaming !== null) return;
  const { chat, index, wasCurrent } = deleted;
  deleted = null;
  $("undo-delete").hidden = true;
  state.chats.chats.splice(Math.min(index, state.chats.chats.length), 0, chat);
  if (wasCurrent) {
    selectChat(chat);
  } else {
    saveChats();
    renderChatList();
    updateButtons();
  }
};

function editButton(i) {
  const b = button("Edit", "edit-msg", () => startEdit(i));
  b.setAttribute("aria-label", "Edit this message");
  return b;
}
function startEdit(i) {
  const el = $("messages").querySelector(`.msg[data-index="${i}"]`);
  const box = document.createElement("textarea");
  box.value = state.chat.messages[i].content;
  box.rows = Math.min(12, box.value.split("\n").length + 1);
  box.setAttribute("aria-label", "Edit your message (Enter saves, Escape cancels)");
  const cancel = () => {
    renderChat();
    $("messages").querySelector(`.msg[data-index="${i}"] .edit-msg`).focus();
  };
  const save = () => saveEdit(i, box.value);
  box.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); save(); }
    if (ev.key === "Escape") { ev.preventDefault(); cancel(); }
  });
  const buttons = document.createElement("div");
  buttons.className = "buttons";
  buttons.append(button(state.loaded ? "Save and regenerate" : "Save", "save-edit", save),
                 button("Cancel", "cancel-edit", cancel));
  el.classList.add("editing");
  el.replaceChildren(box, buttons);
  box.focus();
}
async function saveEdit(i, text) {
  text = text.trim();
  const { images: kept, audio: clips } = state.chat.messages[i];      // its images and clips stay with it
  const inputs = { ...(kept && kept.length ? { images: kept } : {}),
                   ...(clips && clips.length ? { audio: clips } : {}) };
  if ((!text && !Object.keys(inputs).length) || state.streaming !== null) return;
  state.chat.messages.splice(i);   // the edited message and everything after it are replaced
  state.chat.messages.push({ role: "user", content: text, ...inputs });
  if (state.loaded && !state.busy && settingsValid()) {
    await generate();
  } else {                         // kept unanswered: Regenerate answers it once a model is loaded
    saveChat();
    renderChat();
  }
}

// ---------------------------------------------------------------- remembered models
// Files opened with the picker or dropped keep their FileSystemFileHandle in IndexedDB (beside the
// Ollama folder's) and are listed under "Recent models"; after a reload one click, and the browser's
// permission prompt, opens one again. The last model loaded is offered again when a reload left a
// conversation on screen without a model.
const RECENT_KEY = "recent-files";   // in the "handles" store: [{handle, name, size, opened}], newest first
const RECENT_MAX = 8;
let recent = [];                     // as stored: a click must not wait on IndexedDB before asking permission

async function loadRecent() {
  try { recent = (await idbDo("readonly", (s) => s.get(RECENT_KEY))) || []; } catch (e) { recent = []; }
  renderRecent();
}
async function storeRecent() {
  renderRecent();      // the list shows the change at once; storing it follows
  try { await idbDo("readwrite", (s) => s.put(recent, RECENT_KEY)); } catch (e) { /* not persisted */ }
}
async function rememberFile(handle, name, size) {
  const same = await Promise.all(recent.map((r) => r.handle.isSameEntry(handle).catch(() => false)));
  recent = [{ handle, name, size, opened: Date.now() }, ...recent.filter((_, i) => !same[i])].slice(0, RECENT_MAX);
  await storeRecent();
}
function rememberModel({ kind, name, size, handle }) {
  localStorage.setItem(LAST_MODEL_KEY, JSON.stringify({ kind, name, handle: !!handle }));
  if (handle) rememberFile(handle, name, size);
}

function renderRecent() {
  $("recent-list").replaceChildren(...recent.map((r) => {
    const li = document.createElement("li");
    const open = button("", "model", () => reopenFile(r));
    const name = document.createElement("strong");
    name.textContent = r.name;
    const about = document.createElement("small");
    about.textContent = ` ${formatBytes(r.size)} · ${shortDate(r.opened)}`;
    open.append(name);
    if (isLoaded({ file: r.name, size: r.size }) && state.modelSource && state.modelSource.kind === "file") {
      const badge = document.createElement("span");
      badge.className = "loaded-badge";
      badge.textContent = "loaded";
      open.append(badge);
      open.setAttribute("aria-current", "true");
    }
    open.append(about);
    open.setAttribute("aria-label", `Open ${r.name} again`);
    const forget = button("×", "forget", () => { recent = recent.filter((x) => x !== r); storeRecent(); });
    forget.title = "Remove from this list";
    forget.setAttribute("aria-label", `Remove ${r.name} from recent models`);
    li.append(open, forget);
    return li;
  }));
  $("recent").hidden = !recent.length;
  updateButtons();
}
async function reopenFile(r) {
  if (state.busy || state.streaming !== null) return;
  if (!(await grantRead(r.handle, `"${r.name}"`))) return;
  let file;
  try {
    file = await r.handle.getFile();
  } catch (e) {
    showError("model-error", `"${r.name}" is no longer where it was (moved, renamed or deleted). ` +
      "Open it again with Open a GGUF file.");
    return;
  }
  await openFile(file, { kind: "file", handle: r.handle });
}

// "Open a GGUF file": the browser's file picker where it has one (its handle can be remembered),
// else the plain file input.
$("open-file").onclick = async () => {
  if (!window.showOpenFilePicker) { $("file-input").click(); return; }
  let handle;
  try {
    [handle] = await window.showOpenFilePicker({
      id: "gguf", types: [{ description: "GGUF model", accept: { "application/octet-stream": [".gguf"] } }] });
  } catch (e) {
    if (e.name !== "AbortError") showError("model-error", `Could not open the file: ${e.message}`);
    return;
  }
  await openFile(await handle.getFile(), { kind: "file", handle });
};
// A dropped file's handle; null where the browser gives none.
function droppedHandle(dt) {
  const item = dt && [...dt.items].find((i) => i.kind === "file");
  const pending = item && item.getAsFileSystemHandle ? item.getAsFileSystemHandle() : null;
  return Promise.resolve(pending).then((h) => (h && h.kind === "file" ? h : null), () => null);
}

// After a reload the conversation is on screen but no model is loaded: say so plainly, offer the last one.
function lastModel() {
  const last = loadJSON(LAST_MODEL_KEY, null);
  if (!last) return null;
  if (last.kind === "demo") return { ...last, label: "Load the built-in test model", open: () => $("demo").click() };
  if (last.kind === "ollama" && savedFolder) {
    return { ...last, label: `Reopen ${last.name}`, open: async () => {
      if (!(await grantRead(savedFolder, "the folder"))) return;
      await openFolder(savedFolder);
      await openFolderModel(last.name);
    } };
  }
  const r = last.handle && recent.find((x) => x.name === last.name);
  return { ...last, label: r ? `Reopen ${last.name}` : null, open: r ? () => reopenFile(r) : null };
}
function updateReopenNotice() {
  const show = document.body.dataset.state === "ready" && !state.model && state.chat.messages.length > 0;
  $("reopen-notice").hidden = !show;
  if (!show) return;
  const last = lastModel();
  $("reopen-text").textContent = !last ? "No model is loaded: choose one to continue this conversation."
    : last.open ? `The model is not loaded since the page was reloaded: reopen ${last.name} to continue this conversation.`
    : `The model is not loaded since the page was reloaded: open ${last.name} again to continue this conversation.`;
  $("reopen-model").hidden = !(last && last.open);
  if (last && last.open) {
    $("reopen-model").textContent = last.label;
    $("reopen-model").onclick = () => { if (!state.busy) last.open(); };
  }
}

// ---------------------------------------------------------------- speed chart
// Decode tokens/s of each reply in the conversation on screen (the last SPEED_BARS), the streaming
// reply's live: SVG bars with attributes and CSS classes (the page's CSP allows no inline styles).
const SPEED_BARS = 24;
const live = { reply: null, tps: 0, drawn: 0 };   // the reply streaming now, its speed so far
on("token", (m) => {
  if (state.streaming === null) return;
  Object.assign(live, { reply: state.streaming, tps: m.tps || 0 });   // the worker's figure (webapp._token_events)
  const now = performance.now();
  if (now - live.drawn > 250) { live.drawn = now; drawSpeed(); }   // a few times a second is plenty
});
function drawSpeed() {
  const bars = state.chat.messages.filter((m) => m.role === "assistant" && m.stats)
    .map((m) => ({ tps: m.stats.decode_tps, live: false }));
  if (state.streaming !== null && live.reply === state.streaming && live.tps > 0) {
    bars.push({ tps: live.tps, live: true });
  }
  const shown = bars.filter((b) => Number.isFinite(b.tps) && b.tps > 0).slice(-SPEED_BARS);
  $("speed").hidden = !shown.length;
  if (!shown.length) return;
  const top = Math.max(...shown.map((b) => b.tps));
  const step = 240 / SPEED_BARS;
  $("speed-chart").innerHTML = shown.map((b, i) => {
    const h = Math.max(1, (34 * b.tps) / top);
    return `<rect class="bar${b.live ? " live" : ""}" x="${(i * step).toFixed(1)}" y="${(36 - h).toFixed(1)}" ` +
      `width="${(step - 2).toFixed(1)}" height="${h.toFixed(1)}"><title>${b.tps.toFixed(1)} tokens/s` +
      `${b.live ? " so far" : ""}</title></rect>`;
  }).join("");
  const last = shown[shown.length - 1];
  $("speed-text").textContent = `${last.tps.toFixed(1)} tok/s ${last.live ? "now" : "last reply"}` +
    (shown.length > 1 ? ` · best ${top.toFixed(1)}` : "");
  $("speed-chart").setAttribute("aria-label", (shown.length === 1 ? "Tokens per second of the last reply: "
    : `Tokens per second of the last ${shown.length} replies, oldest first: `) + shown.map((b) => b.tps.toFixed(1)).join(", "));
}

// ---------------------------------------------------------------- DiffusionGemma: replies shown denoising
// A DiffusionGemma model writes a block of text at a time: each step's draft of the block (one piece per
// position, from the worker's "denoise" events: pyapp.webapp._DenoiseEvents) is drawn under the committed
// text, the positions the step accepted underlined; a committed block arrives as a token event and is
// appended like any reply text, and announced (the draft itself is hidden from screen readers).
const DENOISE_PARAMS = ["denoise_steps", "denoise_t_min", "denoise_t_max", "denoise_entropy_bound"];
const denoiseLive = { reply: null, last: null, drawn: true };   // state.denoise: the figures, for tests

function showDiffusionSettings(model) {
  const diffusion = !!(model && model.denoise);
  $("denoise-settings").hidden = !diffusion;
  for (const el of document.querySelectorAll(".autoregressive")) el.hidden = diffusion;   // not used by it
}
function denoiseSettings() {
  if (!state.model || !state.model.denoise) return {};
  return Object.fromEntries(DENOISE_PARAMS.map((k) => [k, settingNumber(state.settings[k], state.model.denoise[k])]));
}
function denoiseStatsText(s) {
  const d = s.denoise;
  const stop = { cancelled: " · stopped", length: " · max tokens reached", context: " · context full" };
  return `${plural(s.tokens, "token")} · ${s.decode_tps.toFixed(1)} tok/s · ${plural(d.steps, "denoising step")} in ` +
    `${plural(d.blocks, "block")} · ${d.tokens_per_forward.toFixed(2)} tokens per forward pass` +
    (stop[s.stop_reason] || "");
}
// The figures while denoising; speed and tokens per pass only once a block is committed (before that they
// would read 0: nothing is committed until the block settles).
function denoiseFigures(m) {
  const committed = state.denoise && state.denoise.committed > 0;
  return `Block ${m.block + 1}, step ${m.step} · ${plural(m.steps, "step")} so far · ` +
    (committed ? `${m.tps.toFixed(1)} tok/s · ${m.tpf.toFixed(2)} tokens per forward pass`
               : "tok/s and tokens per forward pass once the first block is written");
}
// A draft piece as shown: Gemma 4's channel and tool markers (random weights draft them) never appear.
const draftPiece = (text) => text.replace(MARKERS, "");
on("denoise", (m) => {
  if (state.streaming === null) return;
  if (denoiseLive.reply !== state.streaming) {     // a new reply
    denoiseLive.reply = state.streaming;
    state.denoise = null;
  }
  denoiseLive.last = m;
  state.denoiseSteps = (state.denoiseSteps || 0) + 1;
  if (prefill.timer) endPrefill();
  state.denoise = { block: m.block, step: m.step, steps: m.steps, accepted: m.accepted.reduce((a, b) => a + b, 0),
                    draft: m.pieces.map(draftPiece).join(""), committed: state.denoise ? state.denoise.committed : 0 };
  if (!denoiseLive.drawn) return;                 // one redraw per frame: the latest step wins
  denoiseLive.drawn = false;
  requestAnimationFrame(drawDraft);
});
function drawDraft() {
  denoiseLive.drawn = true;
  const m = denoiseLive.last;
  const msg = document.querySelector(".msg.streaming");
  if (!m || !msg) return;
  let draft = msg.querySelector(".draft");
  if (!draft) {
    draft = document.createElement("div");
    draft.className = "draft";
    draft.setAttribute("aria-hidden", "true");
    msg.querySelector(".body").after(draft);
  }
  draft.replaceChildren(...m.pieces.map((text, i) => {
    const span = document.createElement("span");
    span.textContent = draftPiece(text);
    if (m.accepted[i]) span.className = "accepted";
    return span;
  }));
  Object.assign(draft.dataset, { block: m.block, step: m.step });
  const meta = msg.querySelector(".meta");
  let line = meta.querySelector(".denoise-stats");
  if (!line) {
    line = document.createElement("span");
    line.className = "denoise-stats";
    meta.prepend(line);
  }
  line.textContent = `${denoiseFigures(m)} · underlined: accepted this step`;
  $("messages").scrollTop = $("messages").scrollHeight;
}
on("token", (m) => {                              // a committed block (DiffusionGemma's token events name it)
  if (state.streaming === null || m.block === undefined) return;
  if (state.denoise) state.denoise.committed = m.block + 1;
  const draft = document.querySelector(".msg.streaming .draft");
  if (draft) draft.replaceChildren();             // the next step drafts the next block
  $("denoise-announce").textContent = `Block ${m.block + 1} written: ${m.text}`;
});

if (localStorage.getItem(CHATS_KEY) === null) saveChats();   // a migrated conversation is kept at once
images = setupImages({ call, state, showError, updateButtons, modelCardChanged });
audio = setupAudio({ call, state, showError, updateButtons });
drafter = setupDrafter({ call, state, showError, updateButtons });
// why a model takes no images or audio: one line each on a phone (style.css), the whole on a tap, or on Enter
// or Space (there they are buttons: a keyboard reaches them; on a wide screen they are plain text, whole)
for (const id of ["attach-why", "audio-why"]) {
  const why = $(id);
  const asButton = () => {
    if (NARROW.matches) {
      why.tabIndex = 0;
      why.setAttribute("role", "button");
      why.setAttribute("aria-expanded", String(why.classList.contains("open")));
    } else {
      for (const a of ["tabindex", "role", "aria-expanded"]) why.removeAttribute(a);
    }
  };
  const toggle = () => {
    why.classList.toggle("open");
    asButton();
  };
  why.addEventListener("click", toggle);
  why.addEventListener("keydown", (e) => {
    if (e.key !== "Enter" && e.key !== " ") return;
    e.preventDefault();
    toggle();
  });
  NARROW.addEventListener("change", asButton);
  asButton();
}
finetune = setupFinetune({ call, state, showError, addSettingChecks, checkSetting, settingProblem, openAdapter,
                           removeAdapter, setState, updateButtons });
showSettings();
renderChat();
boot();
