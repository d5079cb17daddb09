// The Fine-tune panel: a LoRA adapter for the loaded model, trained in the worker one update per command
// (pyapp.webapp's train_* commands, pyapp.train.session), so Stop is taken between updates and the page never
// waits on a long call; the loss is drawn as it falls. Each finished run's adapter and log are kept in the
// browser's origin-private file system (OPFS), listed with the model they belong to.
import { escapeHtml } from "./markdown.js";

const $ = (id) => document.getElementById(id);
const plural = (n, one, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;
const FIELDS = ["rank", "alpha", "lr", "batch", "steps", "epochs", "seq_len"];   // the inputs are "ft_" + name
const STORE_DIR = "adapters";          // in OPFS: <id>.gguf (the adapter) and <id>.json (what it is, its log)
const DATA_FILE = /\.(jsonl|ndjson|json|txt|text|md)$/i;

// app: what the panel uses of app.js: {call, state, showError, addSettingChecks, checkSetting, settingProblem,
// openAdapter, removeAdapter, setState, updateButtons}
export function setupFinetune(app) {
  const { call, state, showError } = app;
  const ft = {
    options: null,      // presets, targets, rules (pyapp.train.session.options)
    base: "quick",      // the preset the fields started from (Custom keeps its hidden settings)
    file: null,         // the training File chosen
    data: null,         // its preview: {name, stats, warnings}
    reading: 0,         // reads of the data in flight
    running: false,
    stopping: false,
    total: 0,
    points: [],         // one StepReport's figures per update
    result: null,       // the last run's train_finish answer (adapter bytes, log, ...)
    saved: [],          // the adapters kept in OPFS (their .json entries), newest first
  };
  state.finetune = ft;  // for tests and the curious

  // ------------------------------------------------------------ tabs: Chat | Fine-tune
  const TABS = [["tab-chat", "chat"], ["tab-finetune", "finetune"]];
  function showTab(panel, focus = false) {
    for (const [tab, id] of TABS) {
      const on = id === panel;
      $(tab).setAttribute("aria-selected", String(on));
      $(id).hidden = !on;
      if (on && focus) $(tab).focus();
    }
    if (panel === "finetune") ensureOptions();
  }
  for (const [tab, panel] of TABS) {
    $(tab).onclick = () => showTab(panel);
    $(tab).addEventListener("keydown", (ev) => {      // arrow keys move between the tabs, as in any tab list
      const i = TABS.findIndex(([t]) => t === tab);
      const j = { ArrowRight: i + 1, ArrowLeft: i - 1, Home: 0, End: TABS.length - 1 }[ev.key];
      if (j === undefined) return;
      ev.preventDefault();
      showTab(TABS[(j + TABS.length) % TABS.length][1], true);
    });
  }

  // ------------------------------------------------------------ settings: a preset, or the fields
  async function ensureOptions() {
    if (ft.options) return ft.options;
    const r = await call("train_options");
    if (r.error) { showError("ft-error", r); return null; }
    if (ft.options) return ft.options;          // a second caller got here first
    ft.options = r;
    app.addSettingChecks(r.rules);              // each field checked as typed, by the worker's rules
    $("ft-target-list").replaceChildren(...r.targets.map(([name, label]) => {
      const l = document.createElement("label");
      l.className = "check";
      const box = document.createElement("input");
      box.type = "checkbox";
      box.value = name;
      box.addEventListener("change", () => { fieldsChanged(); checkTargets(); update(); });
      l.append(box, ` ${name} `);
      const what = document.createElement("small");
      what.textContent = `(${label})`;
      l.append(what);
      return l;
    }));
    applyPreset("quick");
    showTargets();
    return r;
  }
  const targetBoxes = () => [...$("ft-target-list").querySelectorAll("input")];

  function presetText(name) {
    const p = ft.options.presets[name];
    const n = (v) => String(Number(v.toPrecision(4)));
    const length = p.steps ? `${p.steps} updates` : `${n(p.epochs)} epoch${p.epochs === 1 ? "" : "s"}`;
    return `${name[0].toUpperCase()}${name.slice(1)}: rank ${p.rank}, alpha ${n(p.alpha)}, learning rate ` +
      `${n(p.lr)}, ${length}, batch ${p.batch}, ${p.seq_len}-token sequences; adapts ${p.targets.join(", ")}.`;
  }
  function showPresetHelp() {
    const name = $("ft_preset").value;
    $("ft-preset-help").textContent = name === "custom"
      ? `Custom: your values below (the rest as ${ft.base}).` : presetText(name);
  }
  function applyPreset(name) {
    const p = ft.options.presets[name];
    if (!p) return;
    ft.base = name;
    $("ft_preset").value = name;
    for (const k of FIELDS) $(`ft_${k}`).value = p[k] ?? "";
    for (const box of targetBoxes()) box.checked = p.targets.includes(box.value) && !box.closest("label").hidden;
    FIELDS.forEach((k) => app.checkSetting(`ft_${k}`));
    checkTargets();
    showPresetHelp();
  }
  // A field that no longer matches the preset turns the choice into Custom.
  function fieldsChanged() {
    const p = ft.options && ft.options.presets[$("ft_preset").value];
    if (!p) return;
    const same = FIELDS.every((k) => {
      const v = $(`ft_${k}`).value;
      return p[k] == null ? v === "" : v !== "" && Number(v) === Number(p[k]);
    }) && targetBoxes().every((b) => b.checked === (p.targets.includes(b.value) && !b.closest("label").hidden));
    if (!same) { $("ft_preset").value = "custom"; showPresetHelp(); }
  }
  function fields() {
    const out = { preset: ft.base, targets: targetBoxes().filter((b) => b.checked).map((b) => b.value) };
    for (const k of FIELDS) out[k] = $(`ft_${k}`).value;     // as typed: "" keeps the preset's (Steps: by epochs)
    return out;
  }
  function checkTargets() {
    const none = ft.options && !targetBoxes().some((b) => b.checked);
    $("ft-targets-problem").textContent = none ? "Choose at least one projection to adapt." : "";
    $("ft-targets-problem").hidden = !none;
    return !none;
  }
  const fieldsValid = () => !!ft.options && FIELDS.every((k) => !app.settingProblem(`ft_${k}`)) &&
    targetBoxes().some((b) => b.checked);
  // A problem the worker found with a field: said beside it, as the page's own checks do.
  function fieldProblem(field, message) {
    const msg = field === "targets" ? $("ft-targets-problem") : $(`ft_${field}-problem`);
    if (!msg) { showError("ft-error", message); return; }
    msg.textContent = message;
    msg.hidden = false;
    if (field !== "targets") $(`ft_${field}`).setAttribute("aria-invalid", "true");
  }

  $("ft_preset").addEventListener("change", () => {
    const name = $("ft_preset").value;
    if (name === "custom") showPresetHelp(); else applyPreset(name);
    refreshPreview();
    update();
  });
  for (const k of FIELDS) {
    const el = $(`ft_${k}`);
    el.addEventListener("input", () => { app.checkSetting(`ft_${k}`); update(); });
    el.addEventListener("change", () => {
      fieldsChanged();
      if (k === "seq_len" && !app.settingProblem("ft_seq_len")) refreshPreview();   // the cut counts change
      update();
    });
  }

  // ------------------------------------------------------------ the training data
  async function chooseData(file) {
    if (!file || !canEdit()) return;
    showTab("finetune");
    await ensureOptions();
    ft.file = file;
    ft.data = null;                               // Start waits for this file's figures
    if (!gemmaLoaded()) {                         // kept: read with the model's tokenizer once one is loaded
      ft.waiting = file;
      showError("ft-data-error", "");
      $("ft-data-info").textContent = `${file.name} is kept: it will be read as soon as a Gemma 4 model is loaded ` +
        "(its tokenizer counts the tokens).";
      update();
      return;
    }
    ft.waiting = null;
    await preview(file);
  }
  // The chosen file read again with changed settings. Nothing is disabled meanwhile: a field's change event
  // comes on blur, as the user moves to the next field or clicks Start (which waits for this answer).
  async function refreshPreview() {
    if (ft.file && canEdit()) await preview(null);
  }
  // The worker answers reads in the order they were sent: the last one's answer is the one shown.
  let reads = 0;
  function preview(file) {
    const p = readData(file, ++reads);
    ft.previewing = p;
    p.finally(() => { if (ft.previewing === p) ft.previewing = null; });
    return p;
  }
  async function readData(file, n) {
    ft.reading += 1;
    if (file) {
      showError("ft-data-error", "");
      $("ft-data-info").textContent = `Reading ${file.name}…`;
    }
    update();
    const r = await call("train_data", file || undefined, file ? file.name : "", JSON.stringify(fields()));
    ft.reading -= 1;
    if (n === reads) {
      if (r.error && r.field !== undefined && r.field !== "data") {
        fieldProblem(r.field, r.error);             // a setting's problem: the figures shown stay
      } else if (r.error) {
        ft.data = null;
        $("ft-data-info").textContent = "";
        showError("ft-data-error", r);
      } else {
        ft.data = r;
        showError("ft-data-error", "");
        showData(r);
      }
    }
    update();
  }
  function showData(r) {
    const s = r.stats;
    const kind = s.format === "chat" ? "chats (JSONL): the assistant's replies are learned" : "plain text";
    const rows = [
      ["File", `${r.name}: ${kind}`],
      ["Examples", `${s.n_examples}`],
      ["Training", `${plural(s.n_train, "example")} · ${plural(s.train_tokens, "token")}, ${s.train_targets} of them learned`],
      ["Held out", s.n_val ? `${plural(s.n_val, "example")} · ${plural(s.val_tokens, "token")} (validation loss)`
                           : "none"],
      ["Longest", `${plural(s.longest, "token")} (sequences of ${s.seq_len})`],
    ];
    const dl = document.createElement("dl");
    dl.className = "ft-stats";
    for (const [k, v] of rows) {
      const dt = document.createElement("dt");
      const dd = document.createElement("dd");
      dt.textContent = k;
      dd.textContent = v;
      dl.append(dt, dd);
    }
    const out = [dl];
    if (r.warnings.length) {
      const ul = document.createElement("ul");
      ul.className = "ft-warnings";
      ul.setAttribute("aria-label", "Warnings about the data");
      for (const w of r.warnings) {
        const li = document.createElement("li");
        li.textContent = w[0].toUpperCase() + w.slice(1) + ".";
        ul.append(li);
      }
      out.push(ul);
    }
    $("ft-data-info").replaceChildren(...out);
  }
  $("ft-pick").onclick = () => $("ft-file").click();
  $("ft-file").onchange = (ev) => { chooseData(ev.target.files[0]); ev.target.value = ""; };

  // ------------------------------------------------------------ a run: Start, one update at a time, Stop
  const gemmaLoaded = () => state.loaded && state.model && !state.model.denoise;
  const canEdit = () => !ft.running;
  const idle = () => !ft.running && !state.busy && state.streaming === null;

  async function start() {
    if ($("ft-start").disabled) return;
    if (ft.previewing) await ft.previewing;      // settings changed just before: their figures first
    if (ft.running || !ft.data || !fieldsValid()) return;
    showError("ft-error", "");
    $("ft-result").hidden = true;
    ft.result = null;
    ft.running = true;
    ft.stopping = false;
    ft.points = [];
    state.training = true;
    app.updateButtons();
    let failed = null;
    try {
      if (state.adapterLoaded) {                 // training starts from the base model
        $("ft-summary").textContent = "Reloading the model without its adapter…";
        await app.removeAdapter();
        if (!state.loaded) {
          failed = { error: "The model did not reload: see the message under the model." };
          return;
        }
      }
      const r = await call("train_start", JSON.stringify(fields()));
      if (r.error) {
        failed = r;
        if (r.field && r.field !== "data") fieldProblem(r.field, r.error);
        return;
      }
      ft.total = r.total_steps;
      $("ft-progress-box").hidden = false;
      $("ft-chart").removeAttribute("hidden");   // an SVG element has no .hidden property
      drawProgress(null);
      while (!ft.stopping) {
        const s = await call("train_step");
        if (s.error) { failed = s; break; }
        ft.points.push(s);
        drawProgress(s);
        if (s.step >= s.total_steps) break;
      }
      if (failed && failed.device_lost) return;  // the trainer went with the device
      const out = await call("train_finish");
      if (out.error) { failed = failed || out; return; }
      if (!out.steps) return;                    // no update finished: nothing to keep
      ft.result = { ...out, stopped: out.steps < out.total_steps, failed: !!failed };
      ft.result.saved = await store(ft.result);
      showResult();
    } finally {
      ft.running = false;
      state.training = false;
      if (failed) {
        showError("ft-error", failed);
        if (failed.device_lost) { state.loaded = false; $("reload-model").hidden = false; app.setState("ready"); }
      }
      $("ft-summary").textContent = summaryText();
      const last = ft.points[ft.points.length - 1];
      if (last) {
        const end = last.step < last.total_steps ? `Stopped after update ${last.step}` : "Done";
        $("ft-status").textContent = `${end} · ${Math.round(last.tokens_per_s)} tokens/s · ${clock(last.elapsed_s)} in all`;
      }
      app.updateButtons();
    }
  }
  $("ft-start").onclick = start;
  $("ft-stop").onclick = () => {
    if (!ft.running) return;
    ft.stopping = true;
    $("ft-status").textContent = "Stopping after this update…";
    update();
  };

  function clock(s) {
    if (!(s >= 0) || !Number.isFinite(s)) return "";
    s = Math.round(s);
    if (s < 60) return `${s} s`;
    const m = Math.floor(s / 60);
    return m < 60 ? `${m} min ${s % 60} s` : `${Math.floor(m / 60)} h ${m % 60} min`;
  }
  const num = (v) => (v == null ? "–" : v.toFixed(v < 10 ? 3 : 2));
  function summaryText() {
    const last = ft.points[ft.points.length - 1];
    if (!last) return ft.running ? `Step 0 of ${ft.total}: the first update is running…` : "";
    const val = [...ft.points].reverse().find((p) => p.val_loss != null);
    return `Step ${last.step} of ${last.total_steps}, loss ${num(last.loss)}` +
      (val ? `, validation loss ${num(val.val_loss)} (step ${val.step})` : "") +
      (last.best_val_loss != null ? `, best ${num(last.best_val_loss)} at step ${last.best_step}` : "");
  }
  function drawProgress(s) {
    const total = s ? s.total_steps : ft.total;
    $("ft-progress").max = total || 1;
    $("ft-progress").value = s ? s.step : 0;
    const left = !s ? "" : s.step >= total ? "Done" : clock(s.eta_s) ? `${clock(s.eta_s)} left` : "working out the time left";
    $("ft-status").textContent = !s ? "Preparing the first update…" :
      `${left} · ${Math.round(s.tokens_per_s)} tokens/s · ${clock(s.elapsed_s)} so far`;
    if (ft.stopping) $("ft-status").textContent = "Stopping after this update…";
    $("ft-summary").textContent = summaryText();
    drawChart();
  }

  // The loss chart: training loss per update (a line), validation loss where measured (dots on a dashed
  // line); SVG attributes and the stylesheet's classes only (the page's CSP allows no inline styles).
  const W = 360, H = 200, L = 46, R = 10, T = 22, B = 34;
  function drawChart() {
    const pts = ft.points;
    const val = pts.filter((p) => p.val_loss != null);
    const total = Math.max(ft.total, pts.length ? pts[pts.length - 1].step : 1, 2);
    const ys = [...pts.map((p) => p.loss), ...val.map((p) => p.val_loss)].filter(Number.isFinite);
    let lo = ys.length ? Math.min(...ys) : 0, hi = ys.length ? Math.max(...ys) : 1;
    if (hi - lo < 1e-6) { lo -= 0.5; hi += 0.5; }
    const pad = (hi - lo) * 0.08;
    lo = Math.max(0, lo - pad); hi += pad;
    const x = (step) => L + ((step - 1) / (total - 1)) * (W - L - R);
    const y = (v) => T + (1 - (v - lo) / (hi - lo)) * (H - T - B);
    const f = (v) => v.toFixed(1);
    const parts = [
      `<line class="axis" x1="${L}" y1="${H - B}" x2="${W - R}" y2="${H - B}"/>`,
      `<line class="axis" x1="${L}" y1="${T}" x2="${L}" y2="${H - B}"/>`,
    ];
    for (const v of [lo, (lo + hi) / 2, hi]) {
      parts.push(`<line class="grid" x1="${L}" y1="${f(y(v))}" x2="${W - R}" y2="${f(y(v))}"/>`,
                 `<text class="tick" x="${L - 4}" y="${f(y(v) + 3)}" text-anchor="end">${v.toFixed(2)}</text>`);
    }
    for (const step of [...new Set([1, Math.round((1 + total) / 2), total])]) {
      parts.push(`<text class="tick" x="${f(x(step))}" y="${H - B + 13}" text-anchor="middle">${step}</text>`);
    }
    parts.push(`<text class="label" x="${(L + W - R) / 2}" y="${H - 4}" text-anchor="middle">update</text>`,
               `<text class="label" x="12" y="${(T + H - B) / 2}" text-anchor="middle" ` +
               `transform="rotate(-90 12 ${(T + H - B) / 2})">loss</text>`,
               `<line class="train" x1="${L + 4}" y1="10" x2="${L + 22}" y2="10"/>`,
               `<text class="legend" x="${L + 26}" y="13">training</text>`,
               `<line class="val" x1="${L + 90}" y1="10" x2="${L + 108}" y2="10"/>`,
               `<text class="legend" x="${L + 112}" y="13">validation</text>`);
    if (pts.length) {
      parts.push(`<polyline class="train" points="${pts.map((p) => `${f(x(p.step))},${f(y(p.loss))}`).join(" ")}"/>`);
      const last = pts[pts.length - 1];
      parts.push(`<circle class="train-point" cx="${f(x(last.step))}" cy="${f(y(last.loss))}" r="2.5"/>`);
    }
    if (val.length > 1) {
      parts.push(`<polyline class="val" points="${val.map((p) => `${f(x(p.step))},${f(y(p.val_loss))}`).join(" ")}"/>`);
    }
    for (const p of val) {
      parts.push(`<circle class="val-point" cx="${f(x(p.step))}" cy="${f(y(p.val_loss))}" r="3">` +
                 `<title>validation loss ${num(p.val_loss)} at update ${p.step}</title></circle>`);
    }
    const svg = $("ft-chart");
    svg.innerHTML = parts.join("");
    svg.dataset.points = pts.length;
    svg.dataset.valPoints = val.length;
    const first = pts[0], last = pts[pts.length - 1];
    svg.setAttribute("aria-label", !pts.length ? "Loss chart: no update yet." :
      `Loss chart over ${total} updates: training loss ${num(first.loss)} at update ${first.step}` +
      (pts.length > 1 ? `, ${num(last.loss)} at update ${last.step}` : "") +
      (val.length ? `; validation loss ${val.map((p) => `${num(p.val_loss)} at update ${p.step}`).join(", ")}` : "") +
      ".");
  }

  // ------------------------------------------------------------ the result: chat with it, download it
  const stem = (name) => (name || "data").replace(/\.[^.]*$/, "").replace(/[^\w.-]+/g, "_").slice(0, 60) || "data";
  const adapterName = (r) => `${stem(r.data)}-adapter.gguf`;
  function showResult() {
    const r = ft.result;
    const how = r.stopped ? ` (stopped${r.failed ? " by an error" : ""} before the ${r.total_steps} planned)` : "";
    const best = r.best_val_loss != null
      ? `The adapter keeps the parameters with the lowest validation loss, ${num(r.best_val_loss)} at update ${r.best_step}.`
      : `The adapter holds the parameters after update ${r.kept_step}` +
        `${r.stats.n_val ? " (stopped before the first validation loss)" : " (no held-out examples)"}.`;
    const kept = r.saved ? " It is kept in this browser (below)." : " It could not be kept in this browser: download it.";
    $("ft-result-text").textContent = `Trained ${r.steps} update${r.steps === 1 ? "" : "s"}${how}. ${best}${kept}`;
    $("ft-download").textContent = `Download ${adapterName(r)}`;
    $("ft-result").hidden = false;
  }
  function download(bytes, name) {
    const url = URL.createObjectURL(new Blob([bytes], { type: "application/octet-stream" }));
    const a = document.createElement("a");
    a.href = url;
    a.download = name;
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60_000);
  }
  async function useAdapter(file) {
    showTab("chat");
    await app.openAdapter(file);
    if (state.loaded) $("prompt").focus();
  }
  $("ft-download").onclick = () => { if (ft.result) download(ft.result.adapter, adapterName(ft.result)); };
  $("ft-use").onclick = () => {
    if (ft.result && idle()) useAdapter(new File([ft.result.adapter], adapterName(ft.result)));
  };

  // ------------------------------------------------------------ adapters kept in OPFS
  async function storeDir() {
    if (!navigator.storage || !navigator.storage.getDirectory) {
      throw new Error("this browser has no origin-private file system");
    }
    return (await navigator.storage.getDirectory()).getDirectoryHandle(STORE_DIR, { create: true });
  }
  async function writeFile(dir, name, data) {
    const w = await (await dir.getFileHandle(name, { create: true })).createWritable();
    try {
      await w.write(data);
      await w.close();
    } catch (e) {
      await w.abort().catch(() => {});
      throw e;
    }
  }
  async function store(r) {
    const id = `${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;
    const entry = {
      id, version: 1, created: Date.now(), file: `${id}.gguf`, name: adapterName(r), bytes: r.adapter.byteLength,
      model: r.model, data: { name: r.data, stats: r.stats, warnings: r.warnings }, config: r.config,
      steps: r.steps, total_steps: r.total_steps, stopped: r.stopped, best_val_loss: r.best_val_loss,
      best_step: r.best_step, kept_step: r.kept_step, log: r.log,
    };
    try {
      const dir = await storeDir();
      await writeFile(dir, entry.file, r.adapter);              // the adapter first: an entry always has one
      await writeFile(dir, `${id}.json`, JSON.stringify(entry));
    } catch (e) {
      showError("ft-saved-error", `This adapter could not be kept in the browser's storage (${e.message || e}). ` +
        "Download it to keep it.");
      return false;
    }
    showError("ft-saved-error", "");
    ft.saved.unshift(entry);
    renderSaved();
    return true;
  }
  async function loadSaved() {
    try {
      const dir = await storeDir();
      const out = [];
      for await (const [name, h] of dir.entries()) {
        if (h.kind !== "file" || !name.endsWith(".json")) continue;
        try {
          const entry = JSON.parse(await (await h.getFile()).text());
          if (entry && entry.id && entry.file) out.push(entry);
        } catch (e) { /* a damaged entry is left out */ }
      }
      ft.saved = out.sort((a, b) => b.created - a.created);
    } catch (e) {
      showError("ft-saved-error", `The adapters kept in this browser could not be read (${e.message || e}).`);
    }
    renderSaved();
  }
  async function savedFile(entry) {
    const dir = await storeDir();
    return new File([await (await dir.getFileHandle(entry.file)).getFile()], entry.name);
  }
  function sameModel(m) {
    const now = state.loaded ? state.model : null;
    if (!now || !m) return false;
    if (m.digest || now.digest) return m.digest === now.digest;
    return m.file === now.file && m.name === now.name && (m.bytes === undefined || m.bytes === now.bytes);
  }
  function entryAction(entry, what, f) {
    return async () => {
      showError("ft-saved-error", "");
      try {
        await f();
      } catch (e) {
        showError("ft-saved-error", `Could not ${what} “${entry.name}” (${e.message || e}).`);
      }
    };
  }
  function renderSaved() {
    const when = (ms) => new Date(ms).toLocaleString(undefined, { dateStyle: "medium", timeStyle: "short" });
    $("ft-saved").replaceChildren(...ft.saved.map((e) => {
      const li = document.createElement("li");
      const m = e.model || {};
      const about = document.createElement("div");
      about.className = "ft-entry";
      const digest = m.digest ? ` · ${m.digest.replace("sha256:", "sha256 ").slice(0, 19)}…` : "";
      about.innerHTML = `<strong>${escapeHtml(e.name)}</strong> <small>${escapeHtml(when(e.created))}</small><br>` +
        `<small>for ${escapeHtml(m.name || "?")} (${escapeHtml(m.file || "?")}${escapeHtml(digest)})` +
        `${sameModel(m) ? " · the loaded model" : ""}</small><br>` +
        `<small>${e.steps} of ${e.total_steps} updates · rank ${e.config ? e.config.rank : "?"}` +
        `${e.best_val_loss != null ? ` · best validation loss ${num(e.best_val_loss)}` : ""} · ` +
        `${(e.bytes / 2 ** 20).toFixed(2)} MiB</small>`;
      const label = `${e.name} (${when(e.created)})`;
      const buttons = document.createElement("div");
      buttons.className = "buttons";
      const mk = (text, cls, aria, f) => {
        const b = document.createElement("button");
        b.type = "button";
        b.className = cls;
        b.textContent = text;
        b.setAttribute("aria-label", `${aria} ${label}`);
        b.onclick = f;
        return b;
      };
      buttons.append(
        mk("Download", "ft-saved-download", "Download", entryAction(e, "download", async () =>
          download(await (await savedFile(e)).arrayBuffer(), e.name))),
        mk("Use in chat", "ft-saved-use", "Chat with", entryAction(e, "open", async () => {
          if (idle()) await useAdapter(await savedFile(e));
        })),
        mk("Delete", "ft-saved-delete", "Delete", entryAction(e, "delete", async () => {
          const dir = await storeDir();
          await dir.removeEntry(`${e.id}.json`);
          await dir.removeEntry(e.file).catch(() => {});
          ft.saved = ft.saved.filter((x) => x !== e);
          renderSaved();
          $("ft-saved-h").focus();      // the focused Delete button is gone
        })));
      li.append(about, buttons);
      return li;
    }));
    if (!ft.saved.length) $("ft-saved").innerHTML = '<li class="empty">None yet.</li>';
    update();
  }

  // ------------------------------------------------------------ which controls work now
  function update() {
    const model = state.model;
    const ready = gemmaLoaded();
    $("ft-needs-model").hidden = ready;
    $("ft-needs-model").textContent = model && model.denoise && state.loaded
      ? "DiffusionGemma models cannot be fine-tuned here: load a Gemma 4 model."
      : "Load a Gemma 4 model first: fine-tuning trains a LoRA adapter for the model loaded in the chat.";
    const edit = canEdit();
    const free = idle();
    $("ft-pick").disabled = !ready || !free;
    $("ft_preset").disabled = !edit || !ft.options;
    for (const k of FIELDS) $(`ft_${k}`).disabled = !edit || !ft.options;
    for (const b of targetBoxes()) b.disabled = !edit;
    $("ft-start").disabled = !ready || !free || !ft.data || !fieldsValid();
    $("ft-stop").disabled = !ft.running || ft.stopping;
    $("ft-use").disabled = !ready || !free;
    for (const b of document.querySelectorAll("#ft-saved .ft-saved-use")) b.disabled = !ready || !free;
    $("finetune").setAttribute("aria-busy", String(ft.running));
  }

  // after a model (re)loads: the data is read again with its tokenizer
  function modelLoaded() {
    showTargets();
    renderSaved();                              // "the loaded model" follows what is loaded
    if (ft.waiting && gemmaLoaded()) {          // a file chosen before any model: read it now
      const file = ft.waiting;
      ft.waiting = null;
      preview(file);
    } else if (ft.data && gemmaLoaded()) {
      refreshPreview();
    }
  }
  // Only the projections the loaded model has: the router for a mixture-of-experts model, the per-layer
  // input ones for a model with per-layer embeddings.
  function showTargets() {
    const m = state.model;
    for (const box of targetBoxes()) {
      const absent = !!m && ((box.value === "router" && m.moe === false) ||
                             (box.value.startsWith("ple_") && m.ple === false));
      box.closest("label").hidden = absent;
      if (absent) box.checked = false;
    }
    if (ft.options) { checkTargets(); fieldsChanged(); }
  }

  ensureOptions().then(() => update());
  loadSaved();
  return { update, modelLoaded, chooseData, showTab, isDataFile: (f) => !!f && DATA_FILE.test(f.name) };
}
