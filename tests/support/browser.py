"""What the browser tests share (tests/browser/conftest.py's fixtures are built from it; the test modules import
from here, never from each other).

The built app in dist/ is served on a free local port (`serve`); pages are made under the app's
Content-Security-Policy (`under_csp`: Playwright's wait_for_function evals its expression in the page, which the
policy forbids, so it polls with evaluate() instead, and every CSP violation is collected) by one factory
(`open_page`, `open_app`), with helpers to wait for the app's states, to drive its fields, and to set up what a
test needs whatever ran before it on the module's page (`ensure_model`, `ensure_reply`, `fresh_chat`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import socket
import threading
import time
from pathlib import Path

import pytest

from support.paths import FIXTURES, ROOT

DIST = ROOT / "dist"
ARTIFACTS = ROOT / "test-artifacts"
SCREENSHOTS = ROOT / "tests" / "screenshots"   # the chat list and recent models, for people to look at
CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--no-sandbox", "--enable-unsafe-webgpu", "--disable-background-networking"]
TIMEOUT = 180_000   # ms: SwiftShader runs the GPU kernels on the CPU
DEMO = FIXTURES / "demo.gguf"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stale_dist_files() -> list[str]:
    """Sources whose copy in dist/ differs (the page would run other code than the native check)."""
    import zipfile

    def differs(copy: Path, src: Path) -> bool:
        return not copy.exists() or copy.read_bytes() != src.read_bytes()
    stale = [f"web/{f.name}" for f in (ROOT / "web").iterdir() if f.is_file() and differs(DIST / f.name, f)]
    demo = DIST / "models" / "demo.gguf"
    if (FIXTURES / "demo.gguf").exists() and differs(demo, FIXTURES / "demo.gguf"):
        stale.append("tests/fixtures/demo.gguf")
    with zipfile.ZipFile(DIST / "pyapp.zip") as z:
        for name in z.namelist():
            src = ROOT / name
            if src.exists() and z.read(name) != src.read_bytes():
                stale.append(name)
    return stale


@contextlib.contextmanager
def serve():
    """dist/ served on a free local port: yields its URL (skips without dist/ or Chromium; fails on a stale dist/)."""
    if not (DIST / "index.html").exists() or not CHROMIUM.exists():
        pytest.skip("needs dist/ (python3 build.py build) and /usr/bin/chromium")
    stale = stale_dist_files()
    if stale:
        pytest.fail(f"dist/ is older than the sources ({', '.join(stale[:5])}): run python3 build.py build")
    import build
    srv = build.make_server(free_port(), DIST)
    os.environ["SERVE_QUIET"] = "1"
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()


def under_csp(pg):
    """A page ready for the app's CSP: wait_for_function polls with evaluate() (exempt from the
    policy), and violations are collected: the document's events, and the console, where the
    worker reports its own."""
    pg.csp_violations = []
    pg.on("console", lambda m: pg.csp_violations.append(m.text)
          if re.search("Content.Security.Policy", m.text) else None)
    pg.add_init_script("window.cspViolations = []; document.addEventListener('securitypolicyviolation', "
                       "(e) => window.cspViolations.push(`${e.effectiveDirective} ${e.blockedURI}`));")

    def wait_for_function(expression, arg=None, timeout=None, polling=None):
        limit = TIMEOUT if timeout is None else timeout
        deadline = time.monotonic() + limit / 1000
        while True:
            try:
                value = pg.evaluate(expression, arg)
            except Exception as e:                  # a navigation in between: ask the new document
                if "context was destroyed" not in str(e):
                    raise
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"still false after {limit} ms: {expression}")
            pg.wait_for_timeout(polling if isinstance(polling, (int, float)) else 50)

    pg.wait_for_function = wait_for_function
    return pg


def open_page(context, server: str):
    """A new page of this browser context on the app under its CSP, booted (WebGPU ready, or the page saying
    there is none): pageerror events in pg.errors, console errors and warnings in pg.console."""
    pg = under_csp(context.new_page())
    pg.set_default_timeout(TIMEOUT)
    pg.errors, pg.console = [], []
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.on("console", lambda m: pg.console.append(m.text) if m.type in ("error", "warning") else None)
    pg.goto(server + "/index.html")
    wait_state(pg, "ready", "no-webgpu")
    return pg


def open_app(browser, server: str, viewport=(1280, 860), **context):
    """open_page in a new context of its own (its own storage: OPFS, IndexedDB, localStorage), downloads accepted."""
    ctx = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]}, accept_downloads=True, **context)
    return open_page(ctx, server)


def wait_state(page, *states):
    page.wait_for_function(f"{json.dumps(list(states))}.includes(document.body.dataset.state)")


def set_field(page, field: str, value) -> None:
    page.fill(f"#{field}", str(value))
    page.dispatch_event(f"#{field}", "change")


def type_field(page, field: str, value) -> None:
    """A value typed (input events, no change yet), as a user's keystrokes leave it."""
    page.fill(f"#{field}", str(value))


def messages(page) -> list[dict]:
    return page.evaluate("window.app.state.chat.messages")


def as_sent(msgs: list[dict]) -> list[dict]:
    """Messages as the page sends them to the worker: replies with the ids they were generated as."""
    return [{k: m[k] for k in ("role", "content", "ids", "vocab") if k in m} for m in msgs]


def click_and_wait_reply(page, selector: str, timeout=None) -> None:
    """Click what starts a reply (Send, Regenerate) and wait until that reply has ended, by the page's count
    of ended replies: watching `streaming` go non-null can miss a short reply whole on a busy machine."""
    before = page.evaluate("window.app.state.repliesEnded")
    page.click(selector)
    page.wait_for_function(f"window.app.state.repliesEnded > {before}", timeout=timeout)


def send(page, text: str) -> dict:
    page.fill("#prompt", text)
    click_and_wait_reply(page, "#send")
    wait_state(page, "loaded")
    return messages(page)[-1]


def regenerate(page) -> dict:
    """Regenerate the last reply and wait for it: the new reply (the conversation's error line stays empty)."""
    click_and_wait_reply(page, "#regen")
    wait_state(page, "loaded")
    assert page.inner_text("#chat-error") == ""
    return messages(page)[-1]


def reload_model(page) -> None:
    """Press Reload and wait until that load has ended (its outcome is the caller's to check). Not by
    watching `loaded` go false: on a busy machine this process can miss the whole load of a small model
    between two of its polls, so the load's own number (state.loadId) says that it ran."""
    before = page.evaluate("window.app.state.loadId")
    page.click("#reload-model")
    page.wait_for_function(f"window.app.state.loadId > {before} && !window.app.state.busy")


def wait_loaded_file(page, name: str) -> None:
    """Wait until the model opened from file `name` has finished loading (not the previous one)."""
    page.wait_for_function(f"window.app.state.model && window.app.state.model.file === {json.dumps(name)}"
                           " && document.getElementById('model-info').textContent.includes('Loaded in')")
    wait_state(page, "loaded")


def load_box_texts(page, poll_ms: int = 100) -> list[str]:
    """What the load box said, each text once in order, from now until the page is loaded (or back to ready)."""
    texts: list[str] = []
    deadline = time.monotonic() + TIMEOUT / 1000
    while page.evaluate("document.body.dataset.state") not in ("loaded", "ready"):
        text = page.evaluate("document.getElementById('load-box').hidden ? '' : "
                             "document.getElementById('load-text').textContent")
        if text and (not texts or texts[-1] != text):
            texts.append(text)
        if time.monotonic() > deadline:
            raise TimeoutError(f"still loading after {TIMEOUT} ms: {texts[-3:]}")
        page.wait_for_timeout(poll_ms)
    return texts


@functools.cache
def demo_engine():
    """The native engine on the demo model, opened once for every test that compares with it."""
    from pyapp.engine import Engine
    return Engine.open(str(DEMO), context_length=4096)


def native_greedy(conversation: list[dict], max_tokens: int) -> str:
    """The native backend's greedy reply for the same conversation and demo model."""
    from pyapp.chat import render_ids
    from pyapp.engine import SamplingParams
    eng = demo_engine()
    ids = render_ids(eng.tokenizer, conversation)
    return eng.generate(ids, SamplingParams(temperature=0, max_tokens=max_tokens)).text


def read_opfs_file(page, dirname: str, name: str) -> bytes:
    """A file the page keeps in its OPFS (dirname/name): an image's pixels, a clip's samples."""
    import base64
    b64 = page.evaluate("""async ([dirname, name]) => {
        const dir = await (await navigator.storage.getDirectory()).getDirectoryHandle(dirname);
        const bytes = new Uint8Array(await (await (await dir.getFileHandle(name)).getFile()).arrayBuffer());
        let s = '';
        for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
        return btoa(s);
    }""", [dirname, name])
    return base64.b64decode(b64)


def write_opfs_folder(page, dirname: str, files: dict[str, bytes]) -> None:
    """An Ollama models folder in OPFS (files: path -> bytes), offered to the page's folder picker."""
    import base64
    page.evaluate("""async ([dirname, files]) => {
        const root = await navigator.storage.getDirectory();
        const base = await root.getDirectoryHandle(dirname, {create: true});
        for (const [path, b64] of Object.entries(files)) {
            const parts = path.split('/');
            let dir = base;
            for (const p of parts.slice(0, -1)) dir = await dir.getDirectoryHandle(p, {create: true});
            const fh = await dir.getFileHandle(parts[parts.length - 1], {create: true});
            const w = await fh.createWritable();
            await w.write(Uint8Array.from(atob(b64), c => c.charCodeAt(0)));
            await w.close();
        }
        window.__pickDirectory = async () => base;
    }""", [dirname, {k: base64.b64encode(v).decode() for k, v in files.items()}])


def ollama_folder(models: dict[str, list[tuple[str, bytes]]]) -> dict[str, bytes]:
    """Blobs and manifests as Ollama writes them: name:tag -> [(layer media kind, bytes)]."""
    import hashlib
    sha = lambda b: hashlib.sha256(b).hexdigest()   # noqa: E731
    config = json.dumps({"model_format": "gguf", "model_family": "gemma4"}).encode()
    files = {f"blobs/sha256-{sha(config)}": config}
    for name, layers in models.items():
        model, tag = name.split(":")
        files.update({f"blobs/sha256-{sha(b)}": b for _, b in layers})
        files[f"manifests/registry.ollama.ai/library/{model}/{tag}"] = json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                       "digest": f"sha256:{sha(config)}", "size": len(config)},
            "layers": [{"mediaType": f"application/vnd.ollama.image.{kind}", "digest": f"sha256:{sha(b)}",
                        "size": len(b)} for kind, b in layers]}).encode()
    return files


# ------------------------------------------------------------------ what a test needs, made here if missing
def wait_idle(page) -> None:
    """Nothing loading or generating (a model loaded or not)."""
    wait_state(page, "ready", "loaded", "no-webgpu")


def ensure_model(page, path=DEMO, defaults=False) -> None:
    """This fixture model loaded without an adapter, with the settings as a new user has them (GPU memory as the
    page set it: 2048 MiB); defaults: every setting at the model's defaults too (Model defaults), and the model
    reloaded if it was loaded with others (its context)."""
    wait_idle(page)
    if defaults:
        page.click("#reset-settings")
    for field in ("gpu_memory", "context_length", "temperature"):
        if page.get_attribute(f"#{field}", "aria-invalid") == "true" or page.input_value(f"#{field}") == "":
            page.click("#reset-settings")
    if page.input_value("#gpu_memory") != "2048" or page.evaluate("window.app.state.gpuMemory") != 2048:
        set_field(page, "gpu_memory", 2048)
    if page.evaluate(f"!(window.app.state.loaded && window.app.state.model.file === {json.dumps(path.name)})"
                     " || !document.getElementById('adapter-controls').hidden"):
        page.set_input_files("#file-input", str(path))       # a new model: any adapter is forgotten
        wait_loaded_file(page, path.name)
    elif page.is_visible("#reload-model"):                     # settings changed since it loaded
        page.click("#reload-model")
        wait_loaded_file(page, path.name)


def greedy(page, max_tokens: int = 10) -> None:
    """The conversation on screen without a system prompt or thinking, its next replies greedy and at most
    max_tokens long: what the page sends is then exactly the messages native_greedy gets."""
    page.fill("#system", "")
    page.dispatch_event("#system", "change")
    page.set_checked("#thinking", False)
    set_field(page, "temperature", 0)
    set_field(page, "max_tokens", max_tokens)


def fresh_chat(page, max_tokens: int = 10) -> None:
    """A new, empty conversation, greedy (above)."""
    page.click("#new-chat")
    greedy(page, max_tokens)
    assert messages(page) == [] and page.evaluate("!window.app.state.chat.system && !window.app.state.chat.thinking")


def ensure_reply(page) -> dict:
    """The demo model loaded and a conversation with a one-token reply on screen."""
    ensure_model(page)
    done = [m for m in messages(page) if m["role"] == "assistant" and m.get("stats")]
    if done:
        return done[-1]
    set_field(page, "temperature", 0)
    set_field(page, "max_tokens", 1)
    return send(page, "Hi")
