// Images in the chat (issue 28). One or more images go with the next message: the Attach button, a paste
// into the message box, or a drop on it. The worker decodes and resizes each (worker.js prepare_image, at
// the size the chosen model takes for the image budget set for that model) and hands back the RGBA pixels,
// which stay with the conversation in this browser's private storage (kept.js; OPFS: images/<id>.rgba); the
// worker's add_image encodes them on the GPU when a message that holds them is sent, and again after a
// reload or a model change (the worker names each image by a key; a reply that finds a key unknown says
// which, and they are added again from what is kept here).
import { addToWorker, digest, keptFiles, plural, removeButton } from "./kept.js";

const $ = (id) => document.getElementById(id);
const BUDGET_KEY = "gemma4.image_budget.v1";   // {model: soft tokens an image may take}: one per model
const BUDGETS = [70, 140, 280, 560, 1120];     // pyapp.families.gemma4_vision.config.BUDGETS
const DEFAULT_BUDGET = 280;
const SQUARE = { 70: 384, 140: 528, 280: 768, 560: 1104, 1120: 1584 };   // a square image's side at each budget
const THUMB = 160;                       // a thumbnail's longer side, in pixels

export const isImage = (f) => !!f && typeof f.type === "string" && f.type.startsWith("image/");

// app: what this uses of app.js: {call, state, showError, updateButtons, saveChat}
export function setupImages(app) {
  const { call, state, showError } = app;
  const im = {
    info: null,          // the chosen model's {takes, encoder, projector, why, budgets} (pyapp.webapp._images)
    attached: [],        // the next message's images: {id, name, width, height, tokens, budget}
    added: new Set(),    // keys of the images the worker has encoded since the model loaded
    thumbs: new Map(),   // id -> ImageBitmap: a thumbnail, drawn once
    preparing: 0,        // images being decoded and resized
  };
  state.images = im;     // for tests and the curious
  // in OPFS: images/<id>.rgba, the resized RGBA8 pixels (their size in the message)
  const kept = keptFiles({ dir: "images", ext: "rgba", field: "images", wrap: (b) => new Uint8Array(b),
    onLost: (detail) => showError("attach-error", { error: "This browser's storage did not take the image, so it " +
      "stays only until the page is closed (the message can still be sent).", detail }) });
  im.pixels = kept.cache;  // id -> Uint8Array: the resized pixels, the last few used

  // ------------------------------------------------------------ the model: does it take images?
  const modelId = () => (state.model ? state.model.digest || state.model.file || state.model.name : "");
  function budget() {
    const saved = JSON.parse(localStorage.getItem(BUDGET_KEY) || "{}")[modelId()];
    return BUDGETS.includes(saved) ? saved : DEFAULT_BUDGET;
  }
  function setBudget(b) {
    const saved = JSON.parse(localStorage.getItem(BUDGET_KEY) || "{}");
    saved[modelId()] = b;
    localStorage.setItem(BUDGET_KEY, JSON.stringify(saved));
    showBudget();
  }
  function showBudget() {
    const b = budget();
    $("image_budget").value = String(b);
    $("image-budget-help").textContent = `Each image takes up to ${plural(b, "token")} of the context (a square ` +
      `photo is resized to ${SQUARE[b]} × ${SQUARE[b]} pixels). More tokens show the model finer detail and take ` +
      "longer to read. Kept for this model; images already attached keep theirs.";
  }
  // Why attaching is off, in words (null when it is on).
  function whyNot() {
    if (!state.webgpu) return "Images need WebGPU, like the models.";
    if (!state.model) return "Choose a model first: images go to a model that takes them.";
    if (state.model.denoise) return "DiffusionGemma models take text only: choose a Gemma 4 model to attach images.";
    if (!im.info || im.info.takes) return null;
    return "This model has no image encoder in its file, so it cannot take images: add its projector " +
      "(the mmproj-….gguf file published beside the model) under Projector, in the sidebar.";
  }
  function render() {
    const why = whyNot();
    const gen = state.streaming !== null;
    $("attach").disabled = !!why || gen;
    $("image-input").disabled = !!why || gen;
    $("attach-why").textContent = why || "";
    $("attach-why").hidden = !why;
    $("projector-box").hidden = !state.model || !!state.model.denoise;
    const p = im.info && im.info.projector;
    $("projector-info").textContent = p ? `Images are read by the encoder in \u201c${p}\u201d.`
      : im.info && im.info.takes ? "This model's file holds its image encoder: no projector is needed." : "";
    $("remove-projector").hidden = !p;
    for (const id of ["open-projector", "projector-input", "remove-projector"]) $(id).disabled = gen || state.busy;
  }
  // What the model's card says it takes.
  function takesText(m) {
    const hears = !!(state.audio && state.audio.info && state.audio.info.takes);     // audio.js
    const other = (m.parts || []).filter((p) => p !== "text" && p !== "vision" && !(p === "audio" && hears));
    const rest = other.length ? ` (its ${other.join(" and ")} encoder${other.length > 1 ? "s are" : " is"} in the ` +
      "file; this app does not read that yet)" : "";
    const ears = hears ? ", and hears audio" : "";
    if (im.info && im.info.takes) return `Takes text and images${ears}${rest}`;
    if ((m.parts || []).includes("vision")) {
      return `Takes text${ears} here (its image encoder is in the file but cannot be read: ` +
        `${im.info ? im.info.why : ""})${rest}`;
    }
    return `Takes text${hears ? " and hears audio" : ""}${rest}`;
  }
  function modelChosen(info) {
    im.info = info || null;
    im.added.clear();
    showBudget();
    render();
  }
  function modelLoaded(info) {     // a new engine: it has encoded nothing yet
    if (info) im.info = info;
    im.added.clear();
    render();
  }

  const pixelsOf = (entry) => kept.read(entry.id, 4 * entry.width * entry.height);

  // ------------------------------------------------------------ thumbnails
  function thumb(entry, label) {
    const canvas = document.createElement("canvas");
    canvas.className = "thumb";
    canvas.setAttribute("role", "img");
    canvas.setAttribute("aria-label", label);
    canvas.dataset.id = entry.id;
    const scale = Math.min(1, THUMB / Math.max(entry.width, entry.height));
    canvas.width = Math.max(1, Math.round(entry.width * scale));
    canvas.height = Math.max(1, Math.round(entry.height * scale));
    drawThumb(canvas, entry);
    return canvas;
  }
  async function drawThumb(canvas, entry) {
    try {
      let bmp = im.thumbs.get(entry.id);
      if (!bmp) {
        const px = await pixelsOf(entry);
        const data = new ImageData(new Uint8ClampedArray(px.buffer, px.byteOffset, px.byteLength), entry.width, entry.height);
        bmp = await createImageBitmap(data, { resizeWidth: canvas.width, resizeHeight: canvas.height, resizeQuality: "medium" });
        im.thumbs.set(entry.id, bmp);
      }
      canvas.getContext("2d").drawImage(bmp, 0, 0, canvas.width, canvas.height);
      canvas.dataset.drawn = "1";
    } catch (e) {
      canvas.classList.add("missing");
      canvas.setAttribute("aria-label", `${entry.name}: no longer kept in this browser`);
      canvas.title = "This image is no longer kept in this browser's storage.";
    }
  }
  const describe = (e) => `${e.name}, ${e.width} × ${e.height} pixels, ${plural(e.tokens, "token")}`;
  // A sent message's images, for its bubble.
  function messageImages(m) {
    const box = document.createElement("div");
    box.className = "msg-images";
    for (const e of m.images || []) box.append(thumb(e, describe(e)));
    return box;
  }

  // ------------------------------------------------------------ the composer: attach, show, remove
  function renderAttached() {
    const list = $("attachments");
    list.replaceChildren(...im.attached.map((e, i) => {
      const li = document.createElement("li");
      const caption = document.createElement("span");
      caption.className = "thumb-caption";
      caption.textContent = plural(e.tokens, "token");
      const remove = removeButton("remove-image", `Remove ${e.name}`, () => {
        im.attached.splice(i, 1);
        renderAttached();
        $("prompt").focus();
      });
      li.append(thumb(e, describe(e)), caption, remove);
      return li;
    }));
    const n = im.attached.length;
    const tokens = im.attached.reduce((a, e) => a + e.tokens, 0);
    $("attach-status").textContent = im.preparing ? `Preparing ${plural(im.preparing, "image")}…`
      : n ? `${plural(n, "image")} with the next message · ${plural(tokens, "token")}` : "";
    list.hidden = !n;
    app.updateButtons();
  }
  async function attachFiles(files) {
    const images = [...files].filter(isImage);
    if (!images.length) return;
    const why = whyNot();
    if (why) { showError("attach-error", why); return; }
    showError("attach-error", "");
    for (const file of images) {
      im.preparing += 1;
      renderAttached();
      const b = budget();
      let r;
      try {
        r = await call("prepare_image", file, b);
      } finally {
        im.preparing -= 1;
      }
      if (r.error) {
        showError("attach-error", r);
        renderAttached();
        continue;
      }
      const id = await digest(r.pixels);
      const entry = { id, name: file.name || "pasted image", width: r.width, height: r.height, tokens: r.tokens, budget: b };
      await kept.store(id, r.pixels);
      im.attached.push(entry);
      renderAttached();
    }
  }

  // ------------------------------------------------------------ to the worker
  // Every image of these messages the worker has not encoded since the model loaded: added now. Returns null,
  // or the error (its words name the image).
  function ensureAdded(entries, status = () => {}) {
    return addToWorker(entries, im.added, {
      read: pixelsOf,
      add: (e, px) => call("add_image", px, e.width, e.height, e.budget),
      status: (i, n, e) => status(`Reading ${n > 1 ? `image ${i + 1} of ${n}` : "the image"} with the model's image ` +
        `encoder (${plural(e.tokens, "token")})…`),
      lost: (e) => `The image \u201c${e.name}\u201d of this conversation is no longer kept in this browser (its ` +
        "storage was cleared), so the model cannot read it again: edit the message without it, or start a new chat.",
      failed: (e, why) => `The model could not read the image \u201c${e.name}\u201d: ${why}`,
    });
  }
  const entriesOf = (messages) => messages.flatMap((m) => m.images || []);
  // The images a reply did not find (the worker's missing_images): forgotten as added, so they are added again.
  function forget(keys) { for (const k of keys) im.added.delete(k); }
  // A message's images as the worker takes them: parts, by key, with their soft tokens (so the context is counted
  // right before they are encoded again).
  const parts = (m) => (m.images || []).map((e) => ({ type: "image", key: e.key, tokens: e.tokens }));

  // ------------------------------------------------------------ the projector (mmproj) box
  async function addProjector(file) {
    if (!file || state.busy || state.streaming !== null) return;
    showError("projector-error", "");
    const r = await call("add_projector", file, file.name);
    if (r.error) { showError("projector-error", r); return; }
    im.info = r.images;
    im.added.clear();
    app.modelCardChanged(r);
    render();
  }
  $("open-projector").onclick = () => $("projector-input").click();
  $("projector-input").onchange = (ev) => { addProjector(ev.target.files[0]); ev.target.value = ""; };
  $("remove-projector").onclick = async () => {
    if (state.busy || state.streaming !== null) return;
    const r = await call("remove_projector");
    im.info = r.images;
    im.added.clear();
    showError("projector-error", "");
    app.modelCardChanged(r);
    render();
  };

  // ------------------------------------------------------------ attach: button, paste, drop on the message box
  $("attach").onclick = () => $("image-input").click();
  $("image-input").onchange = (ev) => { attachFiles(ev.target.files); ev.target.value = ""; };
  $("prompt").addEventListener("paste", (ev) => {
    const files = [...((ev.clipboardData && ev.clipboardData.files) || [])].filter(isImage);
    if (!files.length) return;
    if (!ev.clipboardData.getData("text/plain")) ev.preventDefault();   // an image alone: nothing to paste as text
    attachFiles(files);
  });
  const composer = $("composer");
  composer.addEventListener("dragover", (ev) => { ev.preventDefault(); composer.classList.add("over"); });
  composer.addEventListener("dragleave", () => composer.classList.remove("over"));
  composer.addEventListener("drop", (ev) => {
    composer.classList.remove("over");
    const files = [...((ev.dataTransfer && ev.dataTransfer.files) || [])];
    if (!files.some(isImage)) return;        // a model or training file: the page's own drop handler takes it
    ev.preventDefault();
    ev.stopPropagation();
    document.querySelectorAll(".drop.over").forEach((z) => z.classList.remove("over"));
    attachFiles(files);
  });
  $("image_budget").addEventListener("change", () => setBudget(Number($("image_budget").value)));
  showBudget();

  return {
    isImage, attachFiles, render, renderAttached, takesText, modelChosen, modelLoaded, messageImages, ensureAdded,
    entriesOf, forget, parts, prune: kept.prune,
    attached: () => im.attached,
    clearAttached: () => { im.attached = []; renderAttached(); },
    restoreAttached: (list) => { im.attached = [...list, ...im.attached]; renderAttached(); },
    busy: () => im.preparing > 0,
  };
}
