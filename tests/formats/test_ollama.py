"""pyapp.ollama over fake Ollama models folders laid out as Ollama writes them."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from pyapp import ollama
from pyapp.gguf import read_gguf_async
from pyapp.ollama import (Layer, LocalDirectory, ModelName, ModelNotFound, OllamaError,
                          gemma4_models, is_gemma4, list_models, resolve, verify_digest)

from support.paths import FIXTURES, ROOT

DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
M = "application/vnd.ollama.image."

GEMMA_TEMPLATE = "{{- range .Messages }}<start_of_turn>{{ .Role }}\n{{ .Content }}<end_of_turn>\n{{ end }}"
GEMMA_PARAMS = {"temperature": 1, "top_k": 64, "top_p": 0.95, "stop": ["<end_of_turn>", "<eos>"]}
# Tensors of the fake gemma4 blob; the big one makes "header only" checkable.
GEMMA_TENSORS = {"token_embd.weight": (16, 8), "blk.0.attn_q.weight": (16, 16), "blk.0.ffn_up.weight": (64, 1024)}
GEMMA_PARAMS_COUNT = 16 * 8 + 16 * 16 + 64 * 1024  # 65920


def write_gguf(path, arch: str, file_type: int, ctx: int, tensors: dict[str, tuple]) -> bytes:
    import gguf
    w = gguf.GGUFWriter(str(path), arch=arch)
    w.add_name(f"tiny {arch}")
    w.add_file_type(file_type)
    w.add_context_length(ctx)
    w.add_uint32(f"{arch}.block_count", 1)
    for name, shape in tensors.items():
        w.add_tensor(name, np.full(shape, 0.5, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


class Folder:
    """Writes blobs and manifests like Ollama's server does."""

    def __init__(self, root):
        self.root = root
        (root / "blobs").mkdir(parents=True, exist_ok=True)
        (root / "manifests").mkdir(exist_ok=True)

    def blob(self, data: bytes, media: str) -> dict:
        digest = hashlib.sha256(data).hexdigest()
        (self.root / "blobs" / f"sha256-{digest}").write_bytes(data)
        return {"mediaType": media, "digest": f"sha256:{digest}", "size": len(data)}

    def manifest(self, name: str, layers: list[dict], config: dict | None = None, raw: bytes | None = None):
        n = ModelName.parse(name)
        path = self.root / "manifests" / n.host / n.namespace / n.model / n.tag
        path.parent.mkdir(parents=True, exist_ok=True)
        if raw is None:
            cfg = self.blob(json.dumps(config or {}).encode(), DOCKER_CONFIG)
            raw = json.dumps({"schemaVersion": 2, "mediaType": DOCKER_MANIFEST,
                              "config": cfg, "layers": layers}).encode()
        path.write_bytes(raw)
        return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ollama")
    f = Folder(tmp / "models")
    gemma = f.blob(write_gguf(tmp / "g.gguf", "gemma4", 15, 131072, GEMMA_TENSORS), M + "model")
    llama = f.blob(write_gguf(tmp / "l.gguf", "llama", 7, 8192, {"token_embd.weight": (4, 4)}), M + "model")
    text = [f.blob(GEMMA_TEMPLATE.encode(), M + "template"),
            f.blob(json.dumps(GEMMA_PARAMS).encode(), M + "params"),
            f.blob(b"Gemma Terms of Use", M + "license")]
    cfg = {"model_format": "gguf", "model_family": "gemma4", "model_families": ["gemma4"],
           "model_type": "5.1B", "file_type": "Q4_K_M"}
    f.manifest("gemma4:e2b", [gemma] + text, cfg)
    f.manifest("gemma4:latest", [gemma] + text, cfg)  # shares every blob with e2b
    f.manifest("llama3.2:1b", [llama, f.blob(b"You are terse.", M + "system")],
               {"model_family": "llama", "file_type": "Q8_0"})
    f.manifest("me/gemma4-custom:q8", [gemma, f.blob(b"{not json", M + "params")], cfg)
    f.manifest("hf.co/unsloth/gemma-4-GGUF:Q4_K_M", [gemma], {})
    f.manifest("broken:latest", [], raw=b'{"layers": [')
    missing = {"mediaType": M + "model", "digest": "sha256:" + "ab" * 32, "size": 1000}
    f.manifest("missing:latest", [missing], {})
    f.manifest("notgguf:latest", [f.blob(b"PK\x03\x04 this is a zip, not a GGUF" * 4, M + "model")], {})
    header_cut = f.blob((tmp / "l.gguf").read_bytes()[:100], M + "model")  # sizes agree, header cut short
    f.manifest("truncated:latest", [header_cut], {})
    short = f.blob(b"GGUF" + bytes(60), M + "model")
    f.manifest("short:latest", [dict(short, size=short["size"] + 5)], {})  # blob smaller than the manifest says
    f.manifest("safetensors:latest", [f.blob(b"x" * 8, M + "tensor")], {})
    (f.root / "manifests" / ".DS_Store").write_bytes(b"\0")  # not a model
    (f.root / "manifests" / "registry.ollama.ai" / "library" / "gemma4" / ".hidden").write_bytes(b"{}")
    return f


@pytest.fixture(scope="module")
def models(folder):
    return {m.name: m for m in list_models(folder.root)}


def test_lists_every_manifest_with_display_names(models):
    assert sorted(models) == sorted([
        "broken:latest", "gemma4:e2b", "gemma4:latest", "hf.co/unsloth/gemma-4-GGUF:Q4_K_M",
        "llama3.2:1b", "me/gemma4-custom:q8", "missing:latest", "notgguf:latest",
        "safetensors:latest", "short:latest", "truncated:latest"])
    g = models["gemma4:e2b"]
    assert g.manifest_path == "manifests/registry.ollama.ai/library/gemma4/e2b"
    assert g.ref.parts == ("registry.ollama.ai", "library", "gemma4", "e2b")
    assert models["me/gemma4-custom:q8"].ref.namespace == "me"
    assert models["hf.co/unsloth/gemma-4-GGUF:Q4_K_M"].ref.host == "hf.co"


def test_gemma_model_details(folder, models):
    g = models["gemma4:e2b"]
    assert g.error is None and g.usable and g.warnings == []
    gguf_bytes = (folder.root / g.model.path).read_bytes()
    assert g.model.digest == "sha256:" + hashlib.sha256(gguf_bytes).hexdigest()
    assert g.model.size == len(gguf_bytes)
    assert g.model.path == "blobs/sha256-" + g.model.digest[7:]
    assert [l.kind for l in g.layers] == ["model", "template", "params", "license"]
    assert g.template == GEMMA_TEMPLATE
    assert g.params == GEMMA_PARAMS
    assert g.params["stop"] == ["<end_of_turn>", "<eos>"]
    assert g.license == "Gemma Terms of Use"
    assert g.system is None
    assert g.config["model_family"] == "gemma4"
    # ID as `ollama list` shows it: sha256 of the manifest file
    raw = (folder.root / g.manifest_path).read_bytes()
    assert g.id == hashlib.sha256(raw).hexdigest()[:12]
    assert g.size == sum(l.size for l in g.layers) + g.config_layer.size


def test_gguf_header_fields(models):
    g = models["gemma4:e2b"]
    assert g.header_read
    assert g.architecture == "gemma4"
    assert g.file_type == "Q4_K_M"
    assert g.context_length == 131072
    assert g.parameter_count == GEMMA_PARAMS_COUNT == 65920
    assert g.parameter_size == "66K"
    assert g.general_name == "tiny gemma4"
    l = models["llama3.2:1b"]
    assert (l.architecture, l.file_type, l.context_length, l.parameter_count) == ("llama", "Q8_0", 8192, 16)
    assert l.system == "You are terse."


def test_gemma4_filter(models):
    g4 = {m.name for m in gemma4_models(list(models.values()))}
    # hf.co's name does not say gemma4, but its GGUF header does
    assert {"gemma4:e2b", "gemma4:latest", "me/gemma4-custom:q8", "hf.co/unsloth/gemma-4-GGUF:Q4_K_M"} <= g4
    assert "llama3.2:1b" not in g4
    usable = {m.name for m in gemma4_models(list(models.values()), usable_only=True)}
    assert usable == {"gemma4:e2b", "gemma4:latest", "me/gemma4-custom:q8", "hf.co/unsloth/gemma-4-GGUF:Q4_K_M"}
    assert not is_gemma4(models["llama3.2:1b"])


def test_bad_params_is_a_warning_not_an_error(models):
    m = models["me/gemma4-custom:q8"]
    assert m.usable and m.params == {}
    assert len(m.warnings) == 1 and "params blob is not valid JSON" in m.warnings[0]


def test_broken_models_carry_reasons(models):
    assert models["broken:latest"].error.startswith("manifests/registry.ollama.ai/library/broken/latest: manifest is not valid JSON")
    assert models["broken:latest"].model is None and not models["broken:latest"].usable
    e = models["missing:latest"].error
    assert "blobs/sha256-" + "ab" * 32 in e and "missing" in e and "ollama pull missing:latest" in e
    e = models["notgguf:latest"].error
    assert "not a readable GGUF file" in e
    e = models["truncated:latest"].error
    assert "not a readable GGUF file: truncated" in e and not models["truncated:latest"].usable
    assert models["short:latest"].error.endswith("is 64 bytes, the manifest says 69: incomplete or corrupt download")
    assert "safetensors" in models["safetensors:latest"].error


def test_header_only_reads_the_header(folder):
    """The GGUF header is parsed without touching tensor data (256 KiB here)."""
    reads = []

    class Counting(LocalDirectory):
        def open(self, path):
            src = super().open(path)
            real = src.read
            src.read = lambda off, n: (reads.append((path, off, n)), real(off, n))[1]
            return src

    m = resolve(Counting(folder.root), "gemma4:e2b")
    assert m.parameter_count == GEMMA_PARAMS_COUNT
    model_reads = [(off, n) for p, off, n in reads if p == m.model.path]
    assert model_reads, "header was not read through the Directory"
    # the header is ~400 bytes; reads may run a few KiB past it, never through the 256 KiB tensor
    assert max(off + n for off, n in model_reads) <= 8192 < m.model.size // 32


def test_listing_without_headers_is_cheap_and_header_can_follow(folder):
    ms = {m.name: m for m in list_models(folder.root, header=False)}
    g = ms["gemma4:e2b"]
    assert not g.header_read and g.architecture is None and g.parameter_count is None
    assert g.file_type == "Q4_K_M" and g.parameter_size == "5.1B"  # from the config blob
    assert is_gemma4(g) and not is_gemma4(ms["llama3.2:1b"])
    ollama.read_header(folder.root, g)
    assert (g.architecture, g.parameter_count, g.parameter_size) == ("gemma4", 65920, "66K")


@pytest.mark.parametrize("name, expect", [
    ("gemma4:e2b", "gemma4:e2b"),
    ("gemma4", "gemma4:latest"),
    ("library/gemma4:e2b", "gemma4:e2b"),
    ("registry.ollama.ai/library/gemma4:e2b", "gemma4:e2b"),
    ("https://registry.ollama.ai/library/gemma4:e2b", "gemma4:e2b"),
    ("gemma4:e2b@sha256:1234", "gemma4:e2b"),
    ("GEMMA4:E2B", "gemma4:e2b"),  # Ollama's names are case-insensitive
    ("me/gemma4-custom:q8", "me/gemma4-custom:q8"),
    ("hf.co/unsloth/gemma-4-GGUF:Q4_K_M", "hf.co/unsloth/gemma-4-GGUF:Q4_K_M"),
])
def test_resolve(folder, name, expect):
    m = resolve(folder.root, name)
    assert m.name == expect and m.usable and m.architecture == "gemma4"


def test_resolve_failures(folder):
    with pytest.raises(ModelNotFound, match=r"'gemma4:27b' is not in this folder \(installed: broken:latest, gemma4:e2b"):
        resolve(folder.root, "gemma4:27b")
    with pytest.raises(ValueError):
        resolve(folder.root, "a/b/c/d")
    with pytest.raises(ValueError):
        resolve(folder.root, "bad name!")
    assert resolve(folder.root, "broken").error is not None


def test_model_names():
    assert ModelName.parse("localhost:5000/ns/m").parts == ("localhost:5000", "ns", "m", "latest")
    assert ModelName.parse("localhost:5000/ns/m:v1").display == "localhost:5000/ns/m:v1"
    assert ModelName.parse("me/x").display == "me/x:latest"
    assert str(ModelName.parse("x:1")) == "registry.ollama.ai/library/x:1"


def test_parent_folder_is_accepted(folder):
    # picking ~/.ollama (parent of models/) works too
    assert resolve(folder.root.parent, "gemma4:e2b").usable


def test_not_an_ollama_folder(tmp_path):
    with pytest.raises(OllamaError, match="no manifests/ folder here"):
        list_models(tmp_path)


def test_verify_digest(folder, models, tmp_path):
    g = models["gemma4:e2b"]
    seen = []
    assert verify_digest(folder.root, g.model, progress=lambda d, t: seen.append((d, t)), chunk=100_000)
    size = g.model.size
    assert seen == [(min(k * 100_000, size), size) for k in range(1, -(-size // 100_000) + 1)]
    assert all(verify_digest(folder.root, l) for l in g.layers[1:])

    # corrupted copies: one byte flipped (same size), and truncated
    bad = Folder(tmp_path / "models")
    data = bytearray((folder.root / g.model.path).read_bytes())
    data[len(data) // 2] ^= 1
    (bad.root / g.model.path).write_bytes(bytes(data))
    assert not verify_digest(bad.root, g.model)
    (bad.root / g.model.path).write_bytes(bytes(data[:-1]))
    assert not verify_digest(bad.root, g.model)
    with pytest.raises(OllamaError, match="is missing"):
        verify_digest(bad.root, Layer(M + "model", "sha256:" + "cd" * 32, 10))


class AsyncLocal:
    """An AsyncDirectory like the browser's (FileSystemDirectoryHandle)."""

    def __init__(self, root):
        self.d = LocalDirectory(root)

    async def list(self, path):
        return self.d.list(path)

    async def exists(self, path):
        return self.d.exists(path)

    async def open(self, path):
        src = self.d.open(path)

        class S:
            size = src.size

            async def read(self, off, n):
                return src.read(off, n)

            def close(self):
                src.close()
        return S()


def test_async_directory_gives_the_same_answers(folder, models):
    ms = asyncio.run(ollama.list_models_async(AsyncLocal(folder.root)))
    assert {m.name: (m.error, m.architecture, m.parameter_count, m.params, m.template) for m in ms} == \
        {m.name: (m.error, m.architecture, m.parameter_count, m.params, m.template) for m in models.values()}
    g = asyncio.run(ollama.resolve_async(AsyncLocal(folder.root), "GEMMA4:e2b"))
    assert g.context_length == 131072
    seen = []
    assert asyncio.run(ollama.verify_digest_async(AsyncLocal(folder.root), g.model,
                                                  lambda d, t: seen.append(d), chunk=1 << 16))
    assert seen[-1] == g.model.size


@pytest.mark.parametrize("header", [True, False])
def test_sync_and_async_drivers_give_identical_listings(folder, header):
    """The same step generators, driven sync over a LocalDirectory and async over a wrapper of it."""
    opened, closed = [], []

    class Tracking(AsyncLocal):
        async def open(self, path):
            s = await super().open(path)
            opened.append(path)
            real = s.close
            s.close = lambda: (closed.append(path), real())[1]
            return s

    sync = list_models(folder.root, header=header)
    async_ = asyncio.run(ollama.list_models_async(Tracking(folder.root), header=header))
    assert async_ == sync  # every field of every model, errors and warnings included
    assert sorted(closed) == sorted(opened) and opened  # the async handler closes what it opened too
    if not header:
        g_sync = next(m for m in sync if m.name == "gemma4:e2b")
        g_async = next(m for m in async_ if m.name == "gemma4:e2b")
        assert ollama.read_header(folder.root, g_sync) == \
            asyncio.run(ollama.read_header_async(AsyncLocal(folder.root), g_async))
        assert g_async.header_read and g_async.parameter_count == GEMMA_PARAMS_COUNT


def test_async_gguf_prefix_grows(folder, models):
    """A tiny first fetch forces the async header reader to fetch more."""
    g = models["gemma4:e2b"]

    async def go():
        src = await AsyncLocal(folder.root).open(g.model.path)
        return await read_gguf_async(src, first=16)

    gg = asyncio.run(go())
    assert gg.metadata["general.architecture"] == "gemma4"
    assert gg.metadata["gemma4.context_length"] == 131072


def test_default_models_dir(monkeypatch, folder):
    monkeypatch.setenv("OLLAMA_MODELS", str(folder.root))
    assert ollama.default_models_dir() == str(folder.root)
    monkeypatch.delenv("OLLAMA_MODELS")
    monkeypatch.setenv("HOME", "/home/x")
    assert ollama.default_models_dir() == "/home/x/.ollama/models"


# ---------------------------------------------------------------- hostile folders
# One bad entry is listed as broken, with the reason; the rest of the folder still lists.

def good_gemma(f: Folder, tmp, name="gemma4:e2b") -> None:
    gemma = f.blob(write_gguf(tmp / "g.gguf", "gemma4", 15, 131072, GEMMA_TENSORS), M + "model")
    f.manifest(name, [gemma], {"model_family": "gemma4"})


class Locked(LocalDirectory):
    """A folder whose listing of `locked` fails, as an unreadable directory does."""

    def __init__(self, root, locked: str):
        super().__init__(root)
        self.locked = locked

    def list(self, path):
        if path == self.locked:
            raise PermissionError(13, "Permission denied", path)
        return super().list(path)


def test_bad_manifests_are_listed_as_broken_and_the_rest_still_lists(tmp_path):
    f = Folder(tmp_path / "models")
    good_gemma(f, tmp_path)
    f.manifest("numeric:latest", [], raw=json.dumps(
        {"layers": [{"mediaType": M + "model", "digest": 12345, "size": 10}]}).encode())
    f.manifest("nested:latest", [], raw=b'{"layers": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    deep = f.blob(b"[" * 100_000 + b"]" * 100_000, DOCKER_CONFIG)
    listy = f.blob(b"[1, 2]", DOCKER_CONFIG)
    gemma = json.loads((f.root / "manifests/registry.ollama.ai/library/gemma4/e2b").read_bytes())["layers"]
    for name, cfg in (("deepconfig:latest", deep), ("listconfig:latest", listy)):
        f.manifest(name, [], raw=json.dumps({"config": cfg, "layers": gemma}).encode())
    f.manifest("secret/hidden:latest", gemma, {})
    models = {m.name: m for m in list_models(Locked(f.root, "manifests/registry.ollama.ai/secret"))}

    assert models["gemma4:e2b"].usable and models["gemma4:e2b"].architecture == "gemma4"
    assert models["numeric:latest"].error == ("manifests/registry.ollama.ai/library/numeric/latest: manifest layer "
                                              "has an invalid digest 12345 (want sha256:<64 hex>)")
    assert models["nested:latest"].error == ("manifests/registry.ollama.ai/library/nested/latest: manifest is not "
                                             "valid JSON (nested too deeply)")
    # a bad config blob is a warning (it only fills fields the GGUF header has too)
    assert models["deepconfig:latest"].usable and models["deepconfig:latest"].warnings == [
        "config blob: config blob is not valid JSON (nested too deeply)"]
    assert models["listconfig:latest"].usable and models["listconfig:latest"].warnings == [
        "config blob: config blob is not a JSON object"]
    locked = models["secret/*:*"]
    assert not locked.usable and locked.error == ("manifests/registry.ollama.ai/secret: cannot list this folder "
                                                  "([Errno 13] Permission denied: 'manifests/registry.ollama.ai/secret')")
    assert len(models) == 6


def test_unreadable_directory_on_disk(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads any directory")
    f = Folder(tmp_path / "models")
    good_gemma(f, tmp_path)
    good_gemma(f, tmp_path, "me/other:latest")
    (f.root / "manifests/registry.ollama.ai/me").chmod(0)
    try:
        models = {m.name: m for m in list_models(f.root)}
    finally:
        (f.root / "manifests/registry.ollama.ai/me").chmod(0o755)
    assert models["gemma4:e2b"].usable and "cannot list this folder" in models["me/*:*"].error


def test_a_repeated_license_layer_is_read_once_and_licenses_are_bounded(tmp_path):
    """A manifest repeating a license layer 400 times built a 100 MB string in 36 s."""
    f = Folder(tmp_path / "models")
    gemma = f.blob(write_gguf(tmp_path / "g.gguf", "gemma4", 15, 131072, GEMMA_TENSORS), M + "model")
    text = "Gemma Terms of Use. " * 12_000                    # 240 KB: just under the license limit
    lic = f.blob(text.encode(), M + "license")
    f.manifest("gemma4:e2b", [gemma] + [lic] * 400, {})
    many = [f.blob(f"license {i}: ".encode() + b"x" * 100_000, M + "license") for i in range(8)]
    f.manifest("gemma4:many", [gemma] + many, {})
    reads = []

    class Counting(LocalDirectory):
        def open(self, path):
            reads.append(path)
            return super().open(path)

    models = {m.name: m for m in list_models(Counting(f.root))}
    g = models["gemma4:e2b"]
    assert g.usable and g.license == text and g.warnings == []
    assert reads.count(lic["digest"].replace("sha256:", "blobs/sha256-")) == 1
    m = models["gemma4:many"]
    assert len(m.license) <= ollama.LICENSE_LIMIT and m.license.startswith("license 0: xxx")
    assert "license 2: " in m.license and "license 3: " not in m.license       # 256 KiB hold two and a half
    assert m.warnings == ["license text cut at 256 KiB"]


def test_the_last_template_system_and_params_count_and_only_they_are_read(tmp_path):
    f = Folder(tmp_path / "models")
    gemma = f.blob(write_gguf(tmp_path / "g.gguf", "gemma4", 15, 131072, GEMMA_TENSORS), M + "model")
    t1, t2 = f.blob(b"first {{ .Prompt }}", M + "template"), f.blob(b"second {{ .Prompt }}", M + "template")
    p1, p2 = f.blob(b'{"top_k": 1}', M + "params"), f.blob(b'{"top_k": 2}', M + "params")
    f.manifest("gemma4:e2b", [gemma, t1, p1, t2, p2, f.blob(b"be brief", M + "system")], {})
    reads = []

    class Counting(LocalDirectory):
        def open(self, path):
            reads.append(path)
            return super().open(path)

    g = list_models(Counting(f.root))[0]
    assert (g.template, g.params, g.system) == ("second {{ .Prompt }}", {"top_k": 2}, "be brief")
    assert t1["digest"].replace("sha256:", "blobs/sha256-") not in reads
    assert p1["digest"].replace("sha256:", "blobs/sha256-") not in reads


def finishes(fn, fifos, seconds=20):
    """fn() run in a thread; if it has not returned after `seconds` (blocked opening a FIFO), the
    FIFOs get a writer so that it can end, and the test fails."""
    import threading
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", _call(fn)), daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        for p in fifos:
            try:
                os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        t.join(5)
        pytest.fail(f"still blocked after {seconds} s (opening a FIFO)")
    kind, value = out["r"]
    if kind == "raise":
        raise value
    return value


def _call(fn):
    try:
        return ("return", fn())
    except BaseException as e:   # re-raised in the test's thread
        return ("raise", e)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_fifos_are_refused_not_waited_on(tmp_path):
    from pyapp.source import FileSource, SourceError
    f = Folder(tmp_path / "models")
    good_gemma(f, tmp_path)
    model = {"mediaType": M + "model", "digest": "sha256:" + "ab" * 32, "size": 100}
    template = {"mediaType": M + "template", "digest": "sha256:" + "cd" * 32, "size": 10}
    for layer in (model, template):
        os.mkfifo(f.root / "blobs" / layer["digest"].replace("sha256:", "sha256-"))
    f.manifest("fifo:latest", [model], {})
    good_gemma(f, tmp_path, "gemma4:fifotemplate")
    man = f.root / "manifests/registry.ollama.ai/library/gemma4/fifotemplate"
    doc = json.loads(man.read_bytes())
    man.write_bytes(json.dumps(dict(doc, layers=doc["layers"] + [template])).encode())
    os.mkfifo(f.root / "manifests/registry.ollama.ai/library/gemma4/fifomanifest")
    fifos = [str(p) for p in tmp_path.rglob("*") if p.is_fifo()]

    models = {m.name: m for m in finishes(lambda: list_models(f.root), fifos)}
    blob = "blobs/sha256-" + "ab" * 32
    assert models["fifo:latest"].error == (f"model blob {blob} is unreadable: {f.root / blob} is not a regular "
                                           "file (a FIFO)")
    assert models["gemma4:fifotemplate"].usable and models["gemma4:fifotemplate"].warnings == [
        f"template blob: {f.root}/blobs/sha256-{'cd' * 32} is not a regular file (a FIFO)"]
    assert "is not a regular file (a FIFO)" in models["gemma4:fifomanifest"].error
    assert models["gemma4:e2b"].usable

    with pytest.raises(SourceError, match="is not a regular file \\(a directory\\)"):
        FileSource(tmp_path)
    r = finishes(lambda: subprocess.run([sys.executable, "-m", "pyapp", "info", fifos[0]], capture_output=True,
                                        text=True, timeout=60, cwd=ROOT), fifos)
    assert r.returncode == 2 and "is not a regular file (a FIFO)" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="no symlinks here")
def test_symlinks_out_of_the_folder_are_refused_by_default(tmp_path):
    f = Folder(tmp_path / "models")
    good_gemma(f, tmp_path)
    outside = Folder(tmp_path / "elsewhere")
    stray = outside.blob(write_gguf(tmp_path / "s.gguf", "gemma4", 15, 4096, GEMMA_TENSORS), M + "model")
    blob = stray["digest"].replace("sha256:", "blobs/sha256-")
    os.symlink(outside.root / blob, f.root / blob)                   # a blob leading out of the folder
    f.manifest("stray:latest", [stray], {})
    outside.manifest("away:latest", [stray], {})                     # a manifests folder leading out
    os.symlink(outside.root / "manifests/registry.ollama.ai/library/away",
               f.root / "manifests/registry.ollama.ai/library/away")
    inside = f.root / "manifests/registry.ollama.ai/library/gemma4/alias"   # a link inside the folder: fine
    os.symlink(f.root / "manifests/registry.ollama.ai/library/gemma4/e2b", inside)

    models = {m.name: m for m in list_models(f.root)}
    assert models["gemma4:e2b"].usable and models["gemma4:alias"].usable
    assert models["stray:latest"].error == (f"model blob {blob} is unreadable: {blob} leads to "
                                            f"{outside.root / blob}, outside the models folder: links out of it "
                                            "are not followed")
    assert models["away:*"].error == ("manifests/registry.ollama.ai/library/away: cannot list this folder "
                                      "(manifests/registry.ollama.ai/library/away leads to "
                                      f"{outside.root}/manifests/registry.ollama.ai/library/away, outside the "
                                      "models folder: links out of it are not followed)")
    with pytest.raises(ollama.OutsideFolderError, match="outside the models folder"):
        ollama.open_model(f.root, models["stray:latest"])

    followed = {m.name: m for m in list_models(LocalDirectory(f.root, follow_links_outside=True))}
    assert followed["stray:latest"].usable and followed["away:latest"].usable


# ---- what each model can take: inline encoders (Ollama's Gemma 4 tags) or a projector layer ----------

FORMS = FIXTURES / "forms"


def write_projector(path, vision: bool, audio: bool) -> bytes:
    """A llama.cpp mmproj GGUF header (what an application/vnd.ollama.image.projector layer holds)."""
    import gguf
    w = gguf.GGUFWriter(str(path), arch="clip")
    if vision:
        w.add_bool("clip.has_vision_encoder", True)
        w.add_string("clip.vision.projector_type", "gemma4v")
    if audio:
        w.add_bool("clip.has_audio_encoder", True)
        w.add_string("clip.audio.projector_type", "gemma4a")
    w.add_tensor("mm.input_projection.weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


def test_parts_from_inline_encoders_and_projector_layers(tmp_path):
    f = Folder(tmp_path / "models")
    ollama_blob = f.blob((FORMS / "ollama-dense.gguf").read_bytes(), M + "model")
    llama_blob = f.blob((FORMS / "llamacpp-dense-fused-qkv.gguf").read_bytes(), M + "model")
    f.manifest("gemma4:e2b", [ollama_blob, f.blob(b"You are a pirate.", M + "system")], {"model_family": "gemma4"})
    f.manifest("gemma4:e2b-qat", [llama_blob, f.blob(write_projector(tmp_path / "p.gguf", True, True),
                                                      M + "projector")], {"model_family": "gemma4"})
    f.manifest("gemma4:12b", [llama_blob, f.blob(write_projector(tmp_path / "q.gguf", True, False),
                                                  M + "projector")], {"model_family": "gemma4"})
    f.manifest("gemma4:bad-proj", [llama_blob, f.blob(b"not a gguf at all" * 8, M + "projector")], {})
    models = {m.name: m for m in list_models(f.root)}
    m = models["gemma4:e2b"]
    assert m.usable and m.parts == ("text", "vision", "audio") and m.projector is None
    assert m.converter.startswith("Ollama's converter") and m.system == "You are a pirate."
    m = models["gemma4:e2b-qat"]
    assert m.usable and m.parts == ("text", "vision", "audio") and m.projector is not None
    assert m.converter.startswith("llama.cpp's converter")
    assert models["gemma4:12b"].parts == ("text", "vision")
    m = models["gemma4:bad-proj"]
    assert m.usable and m.parts == ("text",) and "projector blob" in m.warnings[0]


def test_the_image_encoder_each_model_has(tmp_path):
    """The projector layer a manifest pairs with llama.cpp's text blob (the real mmproj fixture of the same
    checkpoint) is the model's image encoder; the Ollama blob's own inline one; another model's projector
    is refused by name; a text model alone has none (pyapp.families.gemma4_vision.source)."""
    from pyapp.families.gemma4_vision.source import (INLINE, OLLAMA_LAYER, NoImageEncoder, ProjectorError,
                                                     find_image_encoder)
    from pyapp.gguf import read_gguf
    f = Folder(tmp_path / "models")
    text = f.blob((FORMS / "llamacpp-dense-fused-qkv.gguf").read_bytes(), M + "model")
    proj = f.blob((FORMS / "mmproj-dense.gguf").read_bytes(), M + "projector")
    f.manifest("gemma4:e2b-qat", [text, proj], {"model_family": "gemma4"})
    f.manifest("gemma4:wrong-proj", [text, f.blob((FORMS / "mmproj-moe.gguf").read_bytes(), M + "projector")], {})
    f.manifest("gemma4:text", [text], {})
    f.manifest("gemma4:e2b", [f.blob((FORMS / "ollama-dense.gguf").read_bytes(), M + "model")], {})
    models = {m.name: m for m in list_models(f.root)}

    def encoder(name):
        m = models[name]
        projector = read_gguf(f.root / m.projector.path) if m.projector else None
        return find_image_encoder(read_gguf(f.root / m.model.path), ollama_projector=projector,
                                  ollama_name=f"{name}'s projector layer")

    m = models["gemma4:e2b-qat"]
    assert m.projector.digest == proj["digest"] and m.projector.size == proj["size"]
    assert m.parts == ("text", "vision", "audio")
    where = encoder("gemma4:e2b-qat")
    assert (where.kind, where.text_hidden, where.parts) == (OLLAMA_LAYER, 256, ("vision", "audio"))
    assert where.gguf.metadata["clip.vision.projector_type"] == "gemma4v"
    assert encoder("gemma4:e2b").kind == INLINE and models["gemma4:e2b"].projector is None
    with pytest.raises(ProjectorError, match="gemma4:wrong-proj's projector layer belongs to another model"):
        encoder("gemma4:wrong-proj")
    assert models["gemma4:text"].parts == ("text",)
    with pytest.raises(NoImageEncoder, match="this model has no image encoder"):
        encoder("gemma4:text")


def test_choosing_a_tag_with_a_projector_layer_gives_it_images(tmp_path):
    """The app layer: choosing a tag whose manifest pairs llama.cpp's text blob with a projector layer
    reads that layer, and the model's image encoder is it; a text-only tag chosen next has none."""
    from pyapp.app import folder as app_folder
    from pyapp.app import images
    from pyapp.app.session import Session
    from pyapp.families.gemma4_vision.source import NoImageEncoder
    from pyapp.source import FileSource
    f = Folder(tmp_path / "models")
    text = f.blob((FORMS / "llamacpp-dense-fused-qkv.gguf").read_bytes(), M + "model")
    f.manifest("gemma4:e2b-qat", [text, f.blob((FORMS / "mmproj-dense.gguf").read_bytes(), M + "projector")],
               {"model_family": "gemma4"})
    f.manifest("gemma4:text", [text], {})
    session = Session(folder=object(), folder_models={m.name: m for m in list_models(f.root)})

    async def blob_source(path, shown):
        return FileSource(f.root / path)
    asyncio.run(app_folder.choose_model(session, "gemma4:e2b-qat", blob_source))
    assert images.encoder_file(session) is session.ollama_projector
    assert session.ollama_projector.metadata["clip.vision.projector_type"] == "gemma4v"
    asyncio.run(app_folder.choose_model(session, "gemma4:text", blob_source))
    assert session.ollama_projector is None
    with pytest.raises(NoImageEncoder, match="no image encoder"):
        images.encoder_file(session)


def ollama_12b_session(tmp_path, dev):
    """The 12B's tag as Ollama ships it (llama.cpp's text blob and its projector, gemma4uv and gemma4ua, as
    the projector layer), chosen and loaded through the app layer: its Session."""
    from pyapp.app import folder as app_folder
    from pyapp.app import model
    from pyapp.app.session import Session
    from pyapp.source import FileSource
    from pyapp.steps import run
    f = Folder(tmp_path / "models")
    f.manifest("gemma4:12b", [f.blob((FORMS / "gemma4-12b.gguf").read_bytes(), M + "model"),
                              f.blob((FORMS / "mmproj-12b.gguf").read_bytes(), M + "projector")],
               {"model_family": "gemma4"})
    models = {m.name: m for m in list_models(f.root)}
    assert models["gemma4:12b"].parts == ("text", "vision", "audio")
    session = Session(folder=object(), folder_models=models, device=dev)

    async def blob_source(path, shown):
        return FileSource(f.root / path)
    asyncio.run(app_folder.choose_model(session, "gemma4:12b", blob_source))
    run(model.load(session, context_length=128, int8=False))
    return session


@pytest.mark.gpu
def test_the_12b_as_ollama_ships_it_takes_images(tmp_path, dev):
    """The 12B's tag as Ollama ships it, its projector layer's patch projection (gemma4uv): an image (the
    golden's 576 x 240 one at 70 soft tokens) sized, encoded and read in a prompt gives transformers' logits."""
    from pyapp.app import images
    from pyapp.app.logits import logits
    from pyapp.families.gemma4_vision.preprocess import to_rgba
    from pyapp.steps import run
    from support.unified_images import SOFT, case_image, golden
    session = ollama_12b_session(tmp_path, dev)
    gold = golden("mmproj-12b")
    rgb, width, height = case_image(gold, 0)
    assert images.image_size(session, width, height, 70) == {"width": width, "height": height, "tokens": 60}
    image = run(images.encode_image(session, bytes(to_rgba(rgb, width, height)), width, height, 70))
    tokens = [int(t) for t in gold["image_tokens"]]
    got = np.asarray(run(logits(session, tokens, images.soft_runs(tokens, [image], SOFT))))
    want = gold["image_logits"]
    assert np.abs(got - want).max() <= 2e-2 and (got.argmax(-1) == want.argmax(-1)).all()


@pytest.mark.gpu
def test_the_12b_as_ollama_ships_it_takes_audio(tmp_path, dev):
    """The same tag's projector layer's audio frames projection (gemma4ua; Ollama's converter and compat layer
    have no 12B audio of their own): two clips encoded through the app layer (each once: the second request
    of the same samples is the cache's) and read in a prompt give transformers' logits."""
    from pyapp.app import audio
    from pyapp.app.logits import logits
    from pyapp.steps import run
    session = ollama_12b_session(tmp_path, dev)
    gold = np.load(FORMS / "mmproj-12b.audio.npz")
    assert audio.takes_audio(session)
    clips = [run(audio.encode_clip(session, gold[f"clip_{i}"].tolist())) for i in range(2)]
    assert [c.n for c in clips] == [int(gold["tokens_0"]), int(gold["tokens_1"])]
    assert run(audio.encode_clip(session, gold["clip_0"].tolist())) is clips[0]
    tokens = [int(t) for t in gold["two_audio_tokens"]]
    runs = audio.clip_runs(tokens, clips, audio.audio_token(session.engine.tokenizer))
    got = np.asarray(run(logits(session, tokens, runs)))
    want = gold["two_audio_logits"]
    assert np.abs(got - want).max() <= 2e-2 and (got.argmax(-1) == want.argmax(-1)).all()
