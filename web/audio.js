// Audio in the chat (issue 30). Clips go with the next message: recorded with the microphone button (a level
// meter, the time against the 30 s limit, Stop; recording stops itself at 30 s) or attached as files (the Attach
// audio button, or a drop on the message box or the page): WAV, and whatever this browser's Web Audio decodes
// (MP3, Ogg, Opus, M4A/AAC, FLAC, WebM). Each is decoded and resampled to 16 kHz here with Web Audio
// (decodeAudioData of an OfflineAudioContext at 16 kHz; channels averaged into one), never by a server; a file
// longer than 30 s is refused in words (Gemma 4 hears 30 s a clip), a recording is cut at 30 s. The samples stay
// with the conversation in this browser's private storage (kept.js; OPFS: audio/<id>.f32) and a sent message
// plays them back (<audio controls>, a WAV made here of the 16 kHz samples). The worker's add_audio has the GPU
// compute the log-mel features and the soft tokens (the reply says "Preparing audio…" meanwhile) when a message
// that holds a clip is sent, and again after a reload or a model change (a reply that
// finds a key unknown says which: missing_clips).
import { addToWorker, digest, keptFiles, plural, removeButton } from "./kept.js";

const $ = (id) => document.getElementById(id);
const RATE = 16000;                      // pyapp.families.gemma4_audio.features.SAMPLE_RATE
const MAX_SECONDS = 30;                  // features.MAX_SECONDS: the processor's truncation
const MAX_SAMPLES = RATE * MAX_SECONDS;
const EXTENSIONS = /\.(wav|wave|mp3|ogg|oga|opus|m4a|mp4|aac|flac|webm|weba)$/i;

export const isAudio = (f) => !!f && ((typeof f.type === "string" && f.type.startsWith("audio/")) ||
                                      EXTENSIONS.test(f.name || ""));
const seconds = (n) => `${(n / RATE).toFixed(1)} s`;

// A WAV file (16-bit PCM, mono) of float samples at `rate`: what the player plays.
export function wavBlob(samples, rate = RATE) {
  const view = new DataView(new ArrayBuffer(44 + 2 * samples.length));
  const text = (at, s) => [...s].forEach((c, i) => view.setUint8(at + i, c.charCodeAt(0)));
  text(0, "RIFF");
  view.setUint32(4, 36 + 2 * samples.length, true);
  text(8, "WAVEfmt ");
  view.setUint32(16, 16, true);            // the fmt chunk's size
  view.setUint16(20, 1, true);             // PCM
  view.setUint16(22, 1, true);             // one channel
  view.setUint32(24, rate, true);
  view.setUint32(28, 2 * rate, true);      // bytes a second
  view.setUint16(32, 2, true);             // bytes a frame
  view.setUint16(34, 16, true);            // bits a sample
  text(36, "data");
  view.setUint32(40, 2 * samples.length, true);
  for (let i = 0; i < samples.length; i++) {
    const x = Math.max(-1, Math.min(1, samples[i]));
    view.setInt16(44 + 2 * i, x < 0 ? x * 0x8000 : x * 0x7fff, true);
  }
  return new Blob([view.buffer], { type: "audio/wav" });
}

// Encoded audio (a file's bytes, a recording) as 16 kHz mono float samples, by Web Audio: the browser's decoder
// resamples to the context's rate; the channels are averaged, as the command line does.
async function decode(blob) {
  const ctx = new OfflineAudioContext(1, 1, RATE);
  const buffer = await ctx.decodeAudioData(await blob.arrayBuffer());
  const out = new Float32Array(buffer.length);
  for (let c = 0; c < buffer.numberOfChannels; c++) {
    const ch = buffer.getChannelData(c);
    for (let i = 0; i < out.length; i++) out[i] += ch[i] / buffer.numberOfChannels;
  }
  return out;
}

// The microphone's error in plain words (getUserMedia's DOMException names).
function micError(e) {
  const name = e && e.name;
  if (name === "NotAllowedError" || name === "SecurityError") {
    return "The browser did not allow the microphone: allow it for this page (the icon at the left of the " +
      "address bar, or the browser's site settings), then press Record again.";
  }
  if (name === "NotFoundError" || name === "OverconstrainedError") {
    return "No microphone was found: connect one (or choose it in the system's sound settings) and press Record " +
      "again, or attach an audio file instead.";
  }
  if (name === "NotReadableError" || name === "AbortError") {
    return "The microphone could not be started: another program may be using it. Close that program and try again.";
  }
  return "The microphone could not be started.";
}

// app: what this uses of app.js: {call, state, showError, updateButtons}
export function setupAudio(app) {
  const { call, state, showError } = app;
  const au = {
    info: null,          // the chosen model's {takes, why, max_seconds, sample_rate} (pyapp.webapp._audio)
    attached: [],        // the next message's clips: {id, name, samples, tokens}
    added: new Set(),    // keys of the clips the worker has encoded since the model loaded
    preparing: 0,        // clips being decoded and resampled
    recording: null,     // while recording: {stream, recorder, context, analyser, started, timer}
    urls: new Map(),     // id -> the object URL of its WAV, for the players
    last: null,          // the last clip's 16 kHz samples (a Float32Array): for tests and the curious
    limit: MAX_SECONDS,  // the seconds a recording lasts at most (tests shorten it to see it stop itself)
  };
  state.audio = au;
  const kept = keptFiles({ dir: "audio", ext: "f32", field: "audio", wrap: (b) => new Float32Array(b),
    onLost: (detail) => showError("audio-error", { error: "This browser's storage did not take the clip, so it " +
      "stays only until the page is closed (the message can still be sent).", detail }) });
  au.samples = kept.cache;    // id -> Float32Array: the 16 kHz samples, the last few used
  const samplesOf = (e) => kept.read(e.id, 4 * e.samples);

  // ------------------------------------------------------------ the model: does it hear audio?
  function whyNot() {
    if (!state.webgpu) return "Audio needs WebGPU, like the models.";
    if (!state.model) return "Choose a model first: audio goes to a model that hears it.";
    if (state.model.denoise) return "DiffusionGemma models take text only: choose Gemma 4 E2B or E4B to send audio.";
    if (!au.info || au.info.takes) return null;
    return "This model has no audio encoder, so it cannot hear audio: Gemma 4 E2B, E4B and the 12B do (Ollama's " +
      "own E2B and E4B files hold the encoder; for llama.cpp's GGUF add its mmproj-….gguf under Projector, in " +
      "the sidebar).";
  }
  function render() {
    const why = whyNot();
    const gen = state.streaming !== null;
    const rec = !!au.recording;
    $("record").disabled = (!!why || gen) && !rec;
    $("attach-audio").disabled = !!why || gen || rec;
    $("audio-input").disabled = !!why || gen || rec;
    $("audio-why").textContent = why || "";
    $("audio-why").hidden = !why;
    $("record").textContent = rec ? "Stop recording" : "Record";
    $("record").setAttribute("aria-pressed", String(rec));
    $("recorder").hidden = !rec;
  }
  function modelChosen(info) {   // a model chosen, loaded, or a projector added or removed: it has encoded nothing
    if (info !== undefined) au.info = info;
    au.added.clear();
    render();
  }

  // ------------------------------------------------------------ the composer: clips listed, removable
  function clipLabel(e) {
    return `${e.name}, ${seconds(e.samples)}, ${plural(e.tokens, "token")}`;
  }
  function player(e) {
    const el = document.createElement("audio");
    el.controls = true;
    el.preload = "metadata";
    el.className = "clip-player";
    el.setAttribute("aria-label", clipLabel(e));
    const url = au.urls.get(e.id);
    if (url) {
      el.src = url;
    } else {
      samplesOf(e).then((s) => {
        if (!au.urls.has(e.id)) au.urls.set(e.id, URL.createObjectURL(wavBlob(s)));
        el.src = au.urls.get(e.id);
      }).catch(() => {
        const note = document.createElement("span");
        note.className = "clip-missing";
        note.textContent = "(no longer kept in this browser)";
        el.replaceWith(note);
      });
    }
    return el;
  }
  function clipEl(e, tag) {
    const el = document.createElement(tag);
    el.className = "clip";
    el.dataset.id = e.id;
    const caption = document.createElement("span");
    caption.className = "clip-caption";
    caption.textContent = `${e.name} · ${seconds(e.samples)} · ${plural(e.tokens, "token")}`;
    el.append(player(e), caption);
    return el;
  }
  // A sent message's clips, for its bubble.
  function messageAudio(m) {
    const box = document.createElement("div");
    box.className = "msg-audio";
    for (const e of m.audio || []) box.append(clipEl(e, "div"));
    return box;
  }
  function renderAttached() {
    $("audio-attachments").replaceChildren(...au.attached.map((e, i) => {
      const li = clipEl(e, "li");
      li.append(removeButton("remove-clip", `Remove ${e.name}`, () => {
        au.attached.splice(i, 1);
        renderAttached();
        $("prompt").focus();
      }));
      return li;
    }));
    const n = au.attached.length;
    const tokens = au.attached.reduce((a, e) => a + e.tokens, 0);
    $("audio-status").textContent = au.preparing ? "Preparing audio…"
      : n ? `${plural(n, "clip")} with the next message · ${plural(tokens, "token")}` : "";
    $("audio-attachments").hidden = !n;
    app.updateButtons();
  }
  // A clip (a file or a recording) decoded, resampled and kept for the next message. cut: a recording, cut at
  // 30 s; a longer file is refused.
  async function attachBlob(blob, name, cut = false) {
    au.preparing += 1;
    renderAttached();
    try {
      let samples;
      try {
        samples = await decode(blob);
      } catch (e) {
        showError("audio-error", { error: `\u201c${name}\u201d is not audio this browser can read: choose a WAV, ` +
          "MP3, Ogg, Opus, M4A or FLAC file.", detail: String((e && e.message) || e) });
        return;
      }
      if (samples.length > MAX_SAMPLES) {
        if (!cut) {
          showError("audio-error", `\u201c${name}\u201d is ${seconds(samples.length)} long, and Gemma 4 hears at ` +
            `most ${MAX_SECONDS} s a clip: cut it into parts of up to ${MAX_SECONDS} s and attach those.`);
          return;
        }
        samples = samples.slice(0, MAX_SAMPLES);
      }
      const r = await call("clip_tokens", samples.length);
      if (r.error) { showError("audio-error", `\u201c${name}\u201d: ${r.error}`); return; }
      const id = await digest(samples);
      await kept.store(id, samples);
      au.last = samples;
      au.attached.push({ id, name, samples: samples.length, tokens: r.tokens });
    } finally {
      au.preparing -= 1;
      renderAttached();
    }
  }
  async function attachFiles(files) {
    const clips = [...files].filter(isAudio);
    if (!clips.length) return;
    const why = whyNot();
    if (why) { showError("audio-error", why); return; }
    showError("audio-error", "");
    for (const file of clips) await attachBlob(file, file.name || "audio file");
  }

  // ------------------------------------------------------------ recording: the microphone, a meter, the limit
  async function startRecording() {
    const why = whyNot();
    if (why) { showError("audio-error", why); return; }
    showError("audio-error", "");
    if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia || typeof MediaRecorder === "undefined") {
      showError("audio-error", "This browser gives the page no microphone (it needs a recent browser, and the page " +
        "served over https or from localhost): attach an audio file instead.");
      return;
    }
    let stream;
    try {
      stream = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1 } });
    } catch (e) {
      showError("audio-error", { error: micError(e), detail: `${(e && e.name) || "Error"}: ${(e && e.message) || e}` });
      return;
    }
    const recorder = new MediaRecorder(stream);
    const chunks = [];
    recorder.ondataavailable = (ev) => { if (ev.data && ev.data.size) chunks.push(ev.data); };
    const context = new AudioContext();
    const analyser = context.createAnalyser();
    analyser.fftSize = 2048;
    context.createMediaStreamSource(stream).connect(analyser);
    const rec = { stream, recorder, context, analyser, started: performance.now(), timer: null };
    recorder.onstop = async () => {
      clearInterval(rec.timer);
      stream.getTracks().forEach((t) => t.stop());
      context.close().catch(() => {});
      au.recording = null;
      render();
      app.updateButtons();
      const when = new Date().toLocaleTimeString(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit" });
      await attachBlob(new Blob(chunks, { type: recorder.mimeType }), `Recording ${when}`, true);
      $("record").focus();
    };
    au.recording = rec;
    recorder.start(250);
    rec.timer = setInterval(tick, 100);
    tick();
    render();
    app.updateButtons();
    $("rec-stop").focus();
  }
  const level = new Float32Array(2048);
  function tick() {
    const rec = au.recording;
    if (!rec) return;
    const elapsed = (performance.now() - rec.started) / 1000;
    rec.analyser.getFloatTimeDomainData(level);
    let sum = 0;
    for (const x of level) sum += x * x;
    const db = 10 * Math.log10(sum / level.length + 1e-10);      // RMS in dBFS: -60 quiet, 0 full scale
    $("rec-level").value = Math.max(0, Math.min(1, (db + 60) / 60));
    $("rec-time").textContent = `${Math.min(elapsed, au.limit).toFixed(1)} s / ${au.limit} s`;
    if (elapsed >= au.limit) stopRecording();               // the limit: it stops itself
  }
  function stopRecording() {
    const rec = au.recording;
    if (rec && rec.recorder.state !== "inactive") rec.recorder.stop();
  }

  // ------------------------------------------------------------ to the worker
  function ensureAdded(entries, status = () => {}) {
    return addToWorker(entries, au.added, {
      read: samplesOf,
      add: (e, samples) => call("add_audio", samples),
      status: (i, n, e) => status(`Preparing audio${n > 1 ? ` (clip ${i + 1} of ${n})` : ""}: the model's audio ` +
        `encoder hears ${seconds(e.samples)} (${plural(e.tokens, "token")})…`),
      lost: (e) => `The clip \u201c${e.name}\u201d of this conversation is no longer kept in this browser (its ` +
        "storage was cleared), so the model cannot hear it again: edit the message without it, or start a new chat.",
      failed: (e, why) => `The model could not hear the clip \u201c${e.name}\u201d: ${why}`,
    });
  }
  const entriesOf = (messages) => messages.flatMap((m) => m.audio || []);
  function forget(keys) { for (const k of keys) au.added.delete(k); }
  // A message's clips as the worker takes them: parts, by key, with their soft tokens.
  const parts = (m) => (m.audio || []).map((e) => ({ type: "audio", key: e.key, tokens: e.tokens }));

  // ------------------------------------------------------------ the buttons, the drop on the message box
  $("record").onclick = () => (au.recording ? stopRecording() : startRecording());
  $("rec-stop").onclick = stopRecording;
  $("recorder").addEventListener("keydown", (ev) => {
    if (ev.key === "Escape") { ev.preventDefault(); stopRecording(); }
  });
  $("attach-audio").onclick = () => $("audio-input").click();
  $("audio-input").onchange = (ev) => { attachFiles(ev.target.files); ev.target.value = ""; };
  $("composer").addEventListener("drop", (ev) => {
    const files = [...((ev.dataTransfer && ev.dataTransfer.files) || [])];
    if (!files.some(isAudio)) return;        // images.js, or the page's own drop handler, takes the others
    ev.preventDefault();
    ev.stopPropagation();
    $("composer").classList.remove("over");
    document.querySelectorAll(".drop.over").forEach((z) => z.classList.remove("over"));
    attachFiles(files);
  });

  return {
    isAudio, attachFiles, render, modelChosen, messageAudio, ensureAdded, entriesOf, forget, parts,
    prune: kept.prune,
    attached: () => au.attached,
    clearAttached: () => { au.attached = []; renderAttached(); },
    restoreAttached: (list) => { au.attached = [...list, ...au.attached]; renderAttached(); },
    busy: () => au.preparing > 0 || !!au.recording,
  };
}
