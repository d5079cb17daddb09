#!/usr/bin/env python3
"""Set-up, build, serve and test, from a fresh machine.

    python3 build.py serve    # install what is missing, build dist/, serve on :8000
    python3 build.py test     # install what tests need, run the whole suite
    python3 build.py build    # only build dist/
    python3 build.py setup    # only install (venv, npm, system packages, vocab)

Everything the project needs is installed from here: Debian packages (Chromium
for browser tests, Mesa's lavapipe Vulkan driver for the native GPU backend),
npm packages (Pyodide), Python packages into .venv/, and the reference Gemma 4
vocabulary from the llama-cpp-python source distribution (into .cache/).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import http.server
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
CACHE = ROOT / ".cache"
DIST = ROOT / "dist"
VPY = VENV / "bin" / "python"

APT_PACKAGES = {"/usr/bin/chromium": "chromium", "/usr/share/vulkan/icd.d/lvp_icd.x86_64.json": "mesa-vulkan-drivers"}
LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
# Files taken from the llama.cpp copy vendored in that sdist (see tests/ and tools/).
VENDORED = ("models/ggml-vocab-gemma-4.gguf", "models/ggml-vocab-gemma-4.gguf.inp",
            "models/ggml-vocab-gemma-4.gguf.out", "convert_hf_to_gguf.py", "convert_lora_to_gguf.py")
# The converter's own package and the gguf-py it was written against (tools/ only).
VENDORED_DIRS = ("conversion/", "gguf-py/")
# Pure-Python wheels Pyodide's runtime wants next to it (served from dist/, never a CDN).
PYODIDE_WHEELS = ("micropip", "packaging")


def run(cmd, **kw):
    print("+", " ".join(map(str, cmd)), flush=True)
    return subprocess.run(cmd, check=True, **kw)


def _stamp_ok(name: str, key: str) -> bool:
    stamp = CACHE / f"{name}.stamp"
    return stamp.exists() and stamp.read_text() == key


def _stamp(name: str, key: str) -> None:
    CACHE.mkdir(exist_ok=True)
    (CACHE / f"{name}.stamp").write_text(key)


def ensure_system() -> None:
    missing = [pkg for path, pkg in APT_PACKAGES.items() if not Path(path).exists()]
    if not missing:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        print(f"warning: install {' '.join(missing)} (Debian) for GPU and browser tests", file=sys.stderr)
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run(["apt-get", "update", "-q"], env=env)
    run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing], env=env)


def ensure_venv() -> None:
    key = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if VPY.exists() and _stamp_ok("venv", key):
        return
    if not VPY.exists():
        run([sys.executable, "-m", "venv", str(VENV)])
    run([str(VPY), "-m", "pip", "install", "-q", "--upgrade", "pip"])
    run([str(VPY), "-m", "pip", "install", "-q", "-e", f"{ROOT}[test]"])
    _stamp("venv", key)


def ensure_npm() -> None:
    key = hashlib.sha256((ROOT / "package.json").read_bytes()).hexdigest()
    if (ROOT / "node_modules" / "pyodide").exists() and _stamp_ok("npm", key):
        return
    run(["npm", "install", "--no-audit", "--no-fund"], cwd=ROOT)
    _stamp("npm", key)


def ensure_vendored() -> Path:
    """Real Gemma 4 vocabulary, its llama.cpp test vectors and the HF->GGUF model and LoRA converters."""
    out = CACHE / "llama.cpp"
    if _stamp_ok("vendored", LLAMA_CPP_PYTHON) and all((out / f).exists() for f in VENDORED):
        return out
    dl = CACHE / "sdist"
    dl.mkdir(parents=True, exist_ok=True)
    if not list(dl.glob("llama_cpp_python-*.tar.gz")):
        _pip_download_sdist(dl)
    sdist = sorted(dl.glob("llama_cpp_python-*.tar.gz"))[-1]
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist) as tf:
        for m in tf.getmembers():
            rel = m.name.split("/vendor/llama.cpp/", 1)
            if len(rel) == 2 and m.isfile() and (rel[1] in VENDORED or rel[1].startswith(VENDORED_DIRS)):
                dest = out / rel[1]
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(tf.extractfile(m).read())
    missing = [f for f in VENDORED if not (out / f).exists()]
    if missing:
        raise SystemExit(f"{sdist.name} lacks {missing}")
    _stamp("vendored", LLAMA_CPP_PYTHON)
    return out


def _pip_download_sdist(dest: Path) -> None:
    """Fetch the sdist file itself through pip, without building its metadata."""
    py = str(VPY if VPY.exists() else sys.executable)
    # pip prepares the sdist's metadata (about a minute: it installs its build
    # backend in isolation) before keeping the archive; nothing is compiled.
    subprocess.run([py, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                    "-d", str(dest), LLAMA_CPP_PYTHON])
    if not list(dest.glob("llama_cpp_python-*.tar.gz")):
        raise SystemExit(f"could not download {LLAMA_CPP_PYTHON} from PyPI")


def ensure_pyodide_wheels() -> Path:
    out = CACHE / "wheels"
    if _stamp_ok("wheels", ",".join(PYODIDE_WHEELS)):
        return out
    out.mkdir(parents=True, exist_ok=True)
    run([str(VPY), "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
         "--platform", "any", "--python-version", "3.13", "-d", str(out), *PYODIDE_WHEELS])
    _stamp("wheels", ",".join(PYODIDE_WHEELS))
    return out


def setup() -> None:
    ensure_system()
    ensure_venv()
    ensure_npm()
    ensure_vendored()


def build() -> Path:
    """dist/: web app + Pyodide + our package (zip) + shaders + demo model."""
    ensure_npm()
    ensure_venv()
    wheels = ensure_pyodide_wheels()
    if DIST.exists():
        shutil.rmtree(DIST)
    shutil.copytree(ROOT / "web", DIST)
    pyo = ROOT / "node_modules" / "pyodide"
    (DIST / "pyodide").mkdir()
    for f in pyo.iterdir():
        if f.is_file() and f.suffix in (".js", ".mjs", ".wasm", ".json", ".zip", ".whl", ".tar") or f.name.endswith(".d.ts"):
            shutil.copy2(f, DIST / "pyodide" / f.name)
    for whl in wheels.glob("*.whl"):
        shutil.copy2(whl, DIST / "pyodide" / whl.name)
    with zipfile.ZipFile(DIST / "pyapp.zip", "w", zipfile.ZIP_DEFLATED) as z:
        for f in sorted((ROOT / "pyapp").rglob("*.py")):
            rel = f.relative_to(ROOT / "pyapp")
            if "reference" in rel.parts or f.name in ("reference.py", "native.py"):
                continue  # numpy / wgpu-py only (reference/, a family's reference.py): never imported in the browser
            z.write(f, f.relative_to(ROOT))
        for f in sorted((ROOT / "shaders").glob("*.wgsl")):
            z.write(f, f.relative_to(ROOT))
    demo = ROOT / "tests" / "fixtures" / "demo.gguf"
    if demo.exists():
        (DIST / "models").mkdir()
        shutil.copy2(demo, DIST / "models" / "demo.gguf")
    print(f"built {DIST}")
    return DIST


class _Handler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                      ".wasm": "application/wasm", ".mjs": "text/javascript", ".js": "text/javascript"}

    def end_headers(self):
        # Cross-origin isolation: lets the worker use SharedArrayBuffer and precise timers.
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        self.send_header("Cache-Control", "no-cache")
        if self.server.csp:     # every response: the worker's scripts run under their own response's policy
            self.send_header("Content-Security-Policy", self.server.csp)
        super().end_headers()

    def log_message(self, fmt, *args):
        if os.environ.get("SERVE_QUIET") != "1":
            super().log_message(fmt, *args)


def page_policy(directory: Path = DIST) -> str:
    """The Content-Security-Policy of index.html's meta tag (web/index.html is its one source), plus
    frame-ancestors, which only a header can set (no other site may frame the page)."""
    page = directory / "index.html"
    meta = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">',
                     page.read_text(encoding="utf-8") if page.exists() else "")
    return f"{meta.group(1)}; frame-ancestors 'none'" if meta else ""


def make_server(port: int = 8000, directory: Path = DIST) -> http.server.ThreadingHTTPServer:
    handler = functools.partial(_Handler, directory=str(directory))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    srv.csp = page_policy(directory)
    return srv


def serve(port: int) -> None:
    build()
    srv = make_server(port)
    print(f"serving {DIST} on http://localhost:{port}  (Ctrl-C stops)")
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


def test(pytest_args: list[str]) -> int:
    """The suite, or the tests pytest_args select. The whole suite runs as two pytest processes side by side:
    the browser tests (Chromium on SwiftShader; their time goes to the GPU process, which leaves a core
    partly idle) and everything else; each process's output is printed whole, the browser's when it ends."""
    setup()
    build()
    env = dict(os.environ, PYTHONUNBUFFERED="1", GEMMA4_VENDORED=str(CACHE / "llama.cpp"))
    pytest = [str(VPY), "-m", "pytest", "-q", "-rs", "--durations=30"]   # the slowest 30: where CI's time goes
    if any(not a.startswith("-") for a in pytest_args):                  # a selection: one process
        return _pytest_rc(subprocess.run([*pytest, *pytest_args], cwd=ROOT, env=env).returncode)
    with open(ROOT / ".cache" / "browser-tests.log", "w+", encoding="utf-8") as log:
        browser = subprocess.Popen([*pytest, *pytest_args, "tests/browser"], cwd=ROOT, env=env,
                                   stdout=log, stderr=subprocess.STDOUT)
        rest = subprocess.run([*pytest, *pytest_args, "tests", "--ignore=tests/browser"], cwd=ROOT, env=env)
        browser_rc = browser.wait()
        log.seek(0)
        print("\n==== the browser tests (tests/browser), run beside the others ====", flush=True)
        shutil.copyfileobj(log, sys.stdout)
        sys.stdout.flush()
    return max(_pytest_rc(rest.returncode), _pytest_rc(browser_rc))


def _pytest_rc(rc: int) -> int:
    if rc == 5:
        print("pytest collected no tests: that is a failure here", file=sys.stderr)
        return 1
    return rc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["setup", "build", "serve", "test"])
    ap.add_argument("--port", type=int, default=8000)
    args, rest = ap.parse_known_args()
    if args.command == "setup":
        setup()
    elif args.command == "build":
        build()
    elif args.command == "serve":
        setup()
        serve(args.port)
    elif args.command == "test":
        return test(rest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
