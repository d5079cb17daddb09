// What the chat's attachments share (images.js, audio.js): the bytes of each one kept with the conversation in
// this browser's private storage (OPFS: <dir>/<id>.<ext>, id a digest of the bytes) with the last few used in
// memory, the attachments no conversation holds let go at start-up, and the step that gives the worker those it
// has not read since the model loaded (it names each by a key; a reply that finds a key unknown says which, and
// they are forgotten as added, so they are added again from what is kept here).
export const plural = (n, one, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;
const message = (e) => String((e && e.message) || e);

// The first 16 bytes of the SHA-256 of `bytes` (an ArrayBufferView), in hex: an attachment's id.
export async function digest(bytes) {
  const d = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  return [...d.slice(0, 16)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

// The files of one kind of attachment. field: the messages' list of them (m[field]: [{id, ...}]); wrap(buffer):
// the typed array a file's bytes are read back as; onLost(words, detail): said once when storing fails (they then
// last as long as the page).
export function keptFiles({ dir, ext, field, wrap, cacheMax = 12, onLost }) {
  const cache = new Map();      // id -> the bytes' typed array, the last cacheMax used
  let stored = true;            // false once OPFS failed
  const name = (id) => `${id}.${ext}`;
  const handle = async () => (await navigator.storage.getDirectory()).getDirectoryHandle(dir, { create: true });
  function remember(id, data) {
    cache.delete(id);
    cache.set(id, data);
    while (cache.size > cacheMax) cache.delete(cache.keys().next().value);
  }
  async function store(id, data) {
    remember(id, data);
    if (!stored) return;
    try {
      const w = await (await (await handle()).getFileHandle(name(id), { create: true })).createWritable();
      await w.write(data);
      await w.close();
    } catch (e) {
      stored = false;
      onLost(message(e));
    }
  }
  // The bytes kept for this id (checked to be `bytes` long); throws where the storage lost them.
  async function read(id, bytes) {
    let data = cache.get(id);
    if (!data) {
      const file = await (await (await handle()).getFileHandle(name(id))).getFile();
      data = wrap(await file.arrayBuffer());
      if (data.byteLength !== bytes) throw new Error(`${name(id)} has ${data.byteLength} bytes, not ${bytes}`);
    }
    remember(id, data);
    return data;
  }
  // The files no conversation of `chats` holds (deleted ones, attachments never sent) are let go.
  async function prune(chats) {
    const keep = new Set();
    for (const c of chats) for (const m of c.messages) for (const e of m[field] || []) keep.add(name(e.id));
    try {
      const d = await handle();
      const names = [];
      for await (const n of d.keys()) if (!keep.has(n)) names.push(n);
      for (const n of names) await d.removeEntry(n).catch(() => {});
    } catch (e) { /* no OPFS: nothing kept either */ }
  }
  return { store, read, prune, cache };
}

// Every entry the worker has not read since the model loaded (not in `added`): its bytes read back (read(e)) and
// given to the worker (add(e, data): {key} or {error}); each one's key kept on it. Returns null, or the error, in
// words that name the entry: lost(e) where the storage no longer has it, failed(e, why) where the worker refused.
// status(i, n, e): said before each.
export async function addToWorker(entries, added, { read, add, status, lost, failed }) {
  const todo = entries.filter((e) => !e.key || !added.has(e.key));
  for (const [i, e] of todo.entries()) {
    status(i, todo.length, e);
    let data;
    try {
      data = await read(e);
    } catch (err) {
      return { error: lost(e), detail: message(err), lost: e.id };
    }
    const r = await add(e, data);
    if (r.error) return { ...r, error: failed(e, r.error.charAt(0).toLowerCase() + r.error.slice(1)) };
    e.key = r.key;
    added.add(r.key);
  }
  return null;
}

// The × that takes an attachment off the next message.
export function removeButton(className, label, onclick) {
  const remove = document.createElement("button");
  remove.type = "button";
  remove.className = className;
  remove.textContent = "×";
  remove.title = "Remove";
  remove.setAttribute("aria-label", label);
  remove.onclick = onclick;
  return remove;
}
