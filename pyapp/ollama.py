"""Ollama's models folder: manifests -> blobs -> a list of installed models.

Layout (as Ollama writes it; the folder is ~/.ollama/models by default):

    manifests/<host>/<namespace>/<model>/<tag>   JSON, schemaVersion 2:
        {"config": Layer, "layers": [Layer, ...]}
        Layer = {"mediaType": ..., "digest": "sha256:<hex>", "size": N}
    blobs/sha256-<hex>                           content-addressed layers

`gemma4:e2b` lives at manifests/registry.ollama.ai/library/gemma4/e2b. The
layer with media type application/vnd.ollama.image.model is the GGUF file; the
others are small text/JSON blobs (template, params, system, license), the config
blob (JSON: model_family, model_type, file_type, ...) and, in newer tags, a
projector (application/vnd.ollama.image.projector: the image/audio encoders in
llama.cpp's mmproj format; Ollama's original Gemma 4 tags hold them inline in the
model blob instead). `parts` says what a model can take, from both.

All I/O goes through a tiny `Directory` protocol (paths are "/"-joined and
relative to the folder the user picked) so the browser can back it with File
System Access handles. The logic is written once, as generators that yield
request objects (`ListDir`, `Exists`, `Size`, `ReadRange`, `ReadHeader`);
pyapp.steps drives them, answered by a handler over a sync `Directory` (CPython)
or an `AsyncDirectory` (the browser). Each public function has a sync and an
`_async` twin that run the same generator.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Protocol

from .errors import Gemma4Error
from .gguf import read_gguf, read_gguf_async
from .model.forms import PARTS, file_form, projector_parts
from .source import ByteSource, FileSource, SourceError
from .steps import drive, drive_async

DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"

MEDIA_PREFIX = "application/vnd.ollama.image."
MEDIA_MODEL = MEDIA_PREFIX + "model"
MEDIA_TEMPLATE = MEDIA_PREFIX + "template"
MEDIA_PROMPT = MEDIA_PREFIX + "prompt"  # old name of template
MEDIA_PARAMS = MEDIA_PREFIX + "params"
MEDIA_SYSTEM = MEDIA_PREFIX + "system"
MEDIA_LICENSE = MEDIA_PREFIX + "license"
MEDIA_PROJECTOR = MEDIA_PREFIX + "projector"
MEDIA_ADAPTER = MEDIA_PREFIX + "adapter"
MEDIA_TENSOR = MEDIA_PREFIX + "tensor"  # safetensors-style models (not GGUF)

TEXT_LIMIT = 1 << 20  # template/system/params/config blobs larger than this are not read
LICENSE_LIMIT = 256 << 10
HASH_CHUNK = 8 << 20

# llama.cpp's llama_ftype (GGUF general.file_type) -> name; gaps are removed types.
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
    10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M",
    16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S",
    22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M",
    28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0",
    37: "TQ2_0", 38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0", 41: "Q2_0",
}

_DIGEST = re.compile(r"^sha256[:-]([0-9a-fA-F]{64})$")
# Name parts as Ollama validates them (types/model/name.go).
_PART = {
    "host": re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,349}$"),
    "namespace": re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,79}$"),
    "model": re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}$"),
    "tag": re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}$"),
}


class OllamaError(Gemma4Error):
    """Not an Ollama models folder, or no such model."""


class Problem(Enum):
    """Why a model of the folder cannot be used, as its listing found it (OllamaModel.problem; .error words it)."""
    MANIFEST = "manifest"          # the manifest is unreadable or not a manifest
    SAFETENSORS = "safetensors"    # stored as safetensors tensor layers, not one GGUF
    NO_MODEL = "no_model"          # the manifest lists no model layer
    MISSING = "missing"            # the model blob is not in the folder
    INCOMPLETE = "incomplete"      # the model blob is shorter or longer than the manifest says
    UNREADABLE = "unreadable"      # the model blob cannot be read, or not as a GGUF


class ModelNotFound(OllamaError, LookupError):
    pass


# ---------------------------------------------------------------- directories

class Directory(Protocol):
    """Read-only folder. Paths are relative, "/"-separated; "" is the root."""

    def list(self, path: str) -> list[tuple[str, bool]]: ...  # (name, is_dir); FileNotFoundError if absent
    def open(self, path: str) -> ByteSource: ...  # FileNotFoundError if absent
    def exists(self, path: str) -> bool: ...


class AsyncSource(Protocol):
    size: int

    async def read(self, offset: int, n: int) -> bytes: ...


class AsyncDirectory(Protocol):
    """Same as Directory with coroutines (FileSystemDirectoryHandle is async)."""

    async def list(self, path: str) -> list[tuple[str, bool]]: ...
    async def open(self, path: str) -> AsyncSource: ...
    async def exists(self, path: str) -> bool: ...


class OutsideFolderError(Gemma4Error, PermissionError):
    """A path inside the models folder that leads out of it through a symbolic link."""


class LocalDirectory:
    """A folder on the local disk (CPython).

    Symbolic links inside it that lead out of it are not followed (OutsideFolderError, so the
    model is listed as broken, saying where the link goes) unless follow_links_outside: the
    folder the user names is all that is read. Links within the folder are followed."""

    def __init__(self, root: str | os.PathLike, follow_links_outside: bool = False):
        self.root = os.fspath(root)
        self.follow_links_outside = follow_links_outside
        self._real_root = os.path.realpath(self.root)

    def _p(self, path: str) -> str:
        parts = [p for p in path.split("/") if p]
        if any(p == ".." for p in parts):
            raise ValueError(f"path leaves the folder: {path!r}")
        p = os.path.join(self.root, *parts)
        if not self.follow_links_outside:
            real = os.path.realpath(p)
            if os.path.commonpath([self._real_root, real]) != self._real_root:
                raise OutsideFolderError(f"{path} leads to {real}, outside the models folder: links out of it "
                                         "are not followed")
        return p

    def list(self, path: str) -> list[tuple[str, bool]]:
        with os.scandir(self._p(path)) as it:
            return sorted((e.name, e.is_dir()) for e in it)

    def open(self, path: str) -> FileSource:
        p = self._p(path)
        if os.path.isdir(p):
            raise IsADirectoryError(p)
        return FileSource(p)

    def exists(self, path: str) -> bool:
        return os.path.exists(self._p(path))

    def __repr__(self):
        return f"LocalDirectory({self.root!r})"


def default_models_dir() -> str:
    """Where a local Ollama keeps models: $OLLAMA_MODELS, else ~/.ollama/models (CPython)."""
    return os.environ.get("OLLAMA_MODELS") or os.path.join(os.path.expanduser("~"), ".ollama", "models")


def as_directory(d) -> Directory:
    """Accept a Directory or a local path."""
    return d if hasattr(d, "list") and hasattr(d, "open") else LocalDirectory(d)


# ---------------------------------------------------------------- data

@dataclass
class ModelName:
    host: str = DEFAULT_HOST
    namespace: str = DEFAULT_NAMESPACE
    model: str = ""
    tag: str = DEFAULT_TAG

    @classmethod
    def parse(cls, s: str) -> "ModelName":
        """Parse [host/][namespace/]model[:tag][@digest], filling Ollama's defaults."""
        s = s.strip().split("@", 1)[0]
        s = s.split("://", 1)[-1]  # a scheme, as in https://host/ns/model
        tag = DEFAULT_TAG
        if s.rfind(":") > s.rfind("/"):  # a ":" after the last "/" is the tag, not host:port
            s, tag = s.rsplit(":", 1)
        parts = s.split("/")
        if len(parts) > 3:
            raise ValueError(f"not a model name: {s!r}")
        parts = [DEFAULT_HOST, DEFAULT_NAMESPACE][: 3 - len(parts)] + parts
        n = cls(parts[0], parts[1], parts[2], tag)
        if not n.is_valid():
            raise ValueError(f"not a model name: {s!r}")
        return n

    def is_valid(self) -> bool:
        return all(_PART[k].match(getattr(self, k)) for k in _PART)

    @property
    def parts(self) -> tuple[str, str, str, str]:
        return (self.host, self.namespace, self.model, self.tag)

    @property
    def display(self) -> str:
        """Shortest form, like `ollama list`: gemma4:e2b, me/x:latest, host/ns/x:latest."""
        if self.host.lower() != DEFAULT_HOST:
            return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"
        if self.namespace.lower() != DEFAULT_NAMESPACE:
            return f"{self.namespace}/{self.model}:{self.tag}"
        return f"{self.model}:{self.tag}"

    def same(self, other: "ModelName") -> bool:
        return [p.lower() for p in self.parts] == [p.lower() for p in other.parts]

    def __str__(self):
        return "/".join(self.parts[:3]) + ":" + self.tag


@dataclass
class Layer:
    media_type: str
    digest: str  # "sha256:<hex>"
    size: int
    path: str = ""  # blob path relative to the Directory
    name: str = ""  # tensor name (safetensors-style layers)

    def __post_init__(self):
        if not self.path:
            self.path = blob_path(self.digest)

    @property
    def kind(self) -> str:
        """Short media type: model, template, params, ... (or the full type)."""
        t = self.media_type
        return t[len(MEDIA_PREFIX):] if t.startswith(MEDIA_PREFIX) else t


@dataclass
class OllamaModel:
    name: str  # display name, e.g. "gemma4:e2b"
    ref: ModelName
    manifest_path: str
    digest: str = ""  # sha256 of the manifest file (Ollama's model ID)
    layers: list[Layer] = field(default_factory=list)
    config_layer: Layer | None = None
    model: Layer | None = None  # the GGUF blob
    projector: Layer | None = None  # the image/audio encoders' GGUF, when the tag ships them apart
    template: str | None = None
    system: str | None = None
    license: str | None = None
    params: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)  # config blob JSON
    # From the GGUF header (or the config blob when the header was not read):
    architecture: str | None = None
    file_type: str | None = None  # quantization, e.g. "Q4_K_M"
    parameter_count: int | None = None
    context_length: int | None = None
    general_name: str | None = None
    converter: str | None = None  # who wrote the model blob, as far as its metadata tells (pyapp.model.forms)
    parts: tuple[str, ...] = ()  # what it can take: "text", "vision", "audio" (blob and projector together)
    header_read: bool = False
    error: str | None = None  # why this model cannot be used
    problem: Problem | None = None  # the same, as a kind (the app's words for it: pyapp.app.folder)
    warnings: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.digest[:12]

    @property
    def usable(self) -> bool:
        return self.error is None and self.model is not None

    @property
    def size(self) -> int:
        return sum(l.size for l in self.layers) + (self.config_layer.size if self.config_layer else 0)

    @property
    def parameter_size(self) -> str | None:
        """Like Ollama's "4.3B"; from the header, else the config blob."""
        if self.parameter_count:
            return human_number(self.parameter_count)
        return self.config.get("model_type") or None

    def layers_of(self, kind: str) -> list[Layer]:
        return [l for l in self.layers if l.kind == kind]


def blob_path(digest: str, root: str = "") -> str:
    m = _DIGEST.match(digest) if isinstance(digest, str) else None
    if not m:
        raise OllamaError(f"invalid digest {digest!r} (want sha256:<64 hex>)")
    return f"{root}blobs/sha256-{m.group(1).lower()}"


def human_number(n: int) -> str:
    """Ollama's format.HumanNumber: 4300000000 -> "4.3B", 270000000 -> "270M"."""
    for unit, scale, decimals in (("B", 10**9, 1), ("M", 10**6, 2)):
        if n >= scale:
            x = n / scale
            return f"{x:.0f}{unit}" if x == int(x) else f"{x:.{decimals}f}{unit}"
    return f"{n / 1000:.0f}K" if n >= 1000 else str(n)


def file_type_name(ft) -> str | None:
    if ft is None:
        return None
    return FILE_TYPES.get(int(ft), f"type {int(ft)}")


def is_gemma4(model: OllamaModel) -> bool:
    """Trust the GGUF header when read, else the config blob, else the name."""
    if model.architecture:
        return model.architecture == "gemma4"
    families = model.config.get("model_families")
    fam = [model.config.get("model_family")] + (families if isinstance(families, list) else [])
    if any(f == "gemma4" for f in fam):
        return True
    return model.ref.model.lower().startswith("gemma4")


def gemma4_models(models: list[OllamaModel], usable_only: bool = False) -> list[OllamaModel]:
    """The models the UI offers: Gemma 4 ones (optionally only the usable ones)."""
    return [m for m in models if is_gemma4(m) and (m.usable or not usable_only)]


# ---------------------------------------------------------------- pure parsing

def parse_manifest(data: bytes, root: str = "") -> tuple[Layer | None, list[Layer]]:
    """Manifest JSON -> (config layer, layers). Raises ValueError with a reason."""
    doc = _read_json(data, "manifest")
    if not isinstance(doc, dict) or not isinstance(doc.get("layers"), list):
        raise ValueError("manifest has no 'layers' list")

    def layer(d) -> Layer:
        if not isinstance(d, dict):
            raise ValueError(f"manifest layer is not an object: {d!r}")
        digest, size = d.get("digest"), d.get("size")
        if not isinstance(digest, str) or not _DIGEST.match(digest):
            raise ValueError(f"manifest layer has an invalid digest {digest!r} (want sha256:<64 hex>)")
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size < 1 << 63:
            shown = repr(size)
            raise ValueError(f"manifest layer {digest!r} has a bad size "
                             f"{shown if len(shown) <= 40 else shown[:30] + f'... ({len(shown)} characters)'}")
        return Layer(str(d.get("mediaType", "")), digest, size, blob_path(digest, root), str(d.get("name", "")))

    cfg = doc.get("config")
    config = layer(cfg) if isinstance(cfg, dict) and cfg.get("digest") else None
    return config, [layer(d) for d in doc["layers"]]


def apply_header(model: OllamaModel, gguf) -> None:
    """Copy what the UI shows from a parsed GGUF header (pyapp.gguf.read_gguf)."""
    meta = gguf.metadata
    arch = meta.get("general.architecture")
    model.architecture = arch
    model.file_type = file_type_name(meta.get("general.file_type")) or model.file_type
    model.general_name = meta.get("general.name")
    ctx = meta.get(f"{arch}.context_length")
    model.context_length = int(ctx) if ctx is not None else None
    count = sum(_n_elements(t) for t in gguf.tensors.values())
    model.parameter_count = count or meta.get("general.parameter_count") or None
    form = file_form(meta, gguf.tensors)
    model.converter = form.converter
    model.parts = tuple(p for p in PARTS if p in form.parts or p in model.parts)
    model.header_read = True


def _n_elements(t) -> int:
    n = getattr(t, "n_elements", None)
    if n is None:
        n = 1
        for d in t.shape:
            n *= int(d)
    return int(n)


def _apply_config(model: OllamaModel) -> None:
    """Fallbacks from the config blob until the GGUF header is read."""
    c = model.config
    model.file_type = model.file_type or c.get("file_type") or None


def _read_json(data: bytes, what: str):
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{what} is not valid JSON ({e})") from None
    except RecursionError:      # [[[[...]]]]: json recurses once per level
        raise ValueError(f"{what} is not valid JSON (nested too deeply)") from None
    except ValueError:          # an integer of more than 4300 digits: Python's limit, in Python's words
        raise ValueError(f"{what} holds a number too long to read (thousands of digits): the file is damaged; "
                         "pull the model again") from None


# ---------------------------------------------------------------- I/O requests
# What the steps below yield; paths are relative to the picked folder.

@dataclass(frozen=True)
class ListDir:
    path: str  # -> [(name, is_dir)]; FileNotFoundError if absent


@dataclass(frozen=True)
class Exists:
    path: str  # -> bool


@dataclass(frozen=True)
class Size:
    path: str  # -> size of the file in bytes


@dataclass(frozen=True)
class ReadRange:
    path: str
    offset: int
    n: int  # -> bytes


@dataclass(frozen=True)
class ReadHeader:
    path: str  # -> the file's parsed GGUF header (pyapp.gguf.GGUFFile)


# ---------------------------------------------------------------- I/O steps
# Generators: `x = yield Request(...)` asks the handler for I/O.

def _find_root():
    # Accept the models folder itself, or ~/.ollama, or the home folder.
    for root in ("", "models/", ".ollama/models/"):
        if (yield Exists(root + "manifests")):
            return root
    raise OllamaError(
        "no manifests/ folder here: pick Ollama's models folder "
        "(~/.ollama/models; on Windows %USERPROFILE%\\.ollama\\models; "
        "Linux service installs: /usr/share/ollama/.ollama/models; or $OLLAMA_MODELS)")


def _manifest_paths(root: str):
    """All 4-deep manifest files (host/namespace/model/tag), like Ollama's glob, and the folders
    below manifests/ that could not be listed: (found [(name, path)], broken [(name, path, why)])."""
    found, broken = [], []
    base = root + "manifests"

    def dirs(path, *parts):
        """The subfolders of path; a folder that cannot be listed is broken (its name: parts, then *)."""
        try:
            entries = yield ListDir(path)
        except (OSError, SourceError) as e:
            if not parts:           # manifests/ itself: nothing to list at all
                raise OllamaError(f"cannot list {path}: {_why(e)}") from e
            broken.append((ModelName(*parts, *["*"] * (4 - len(parts))), path,
                           f"cannot list this folder ({_why(e)})"))
            return []
        return [n for n, is_dir in entries if is_dir and not n.startswith(".")]

    for host in (yield from dirs(base)):
        for ns in (yield from dirs(f"{base}/{host}", host)):
            for model in (yield from dirs(f"{base}/{host}/{ns}", host, ns)):
                path = f"{base}/{host}/{ns}/{model}"
                try:
                    tags = yield ListDir(path)
                except (OSError, SourceError) as e:
                    broken.append((ModelName(host, ns, model, "*"), path, f"cannot list this folder ({_why(e)})"))
                    continue
                for tag, t_dir in tags:
                    name = ModelName(host, ns, model, tag)
                    if not t_dir and not tag.startswith(".") and name.is_valid():
                        found.append((name, f"{path}/{tag}"))
    return found, broken


def _read_prefix(path: str, limit: int):
    """(the first `limit` bytes of a blob, whether it is longer)."""
    size = yield Size(path)
    return (yield ReadRange(path, 0, min(size, limit))), size > limit


def _read_all(path: str, limit: int):
    """Whole small blob, or None when larger than limit."""
    size = yield Size(path)
    if size > limit:
        return None
    return (yield ReadRange(path, 0, size))


# Text layers Ollama keeps one of (the last in the manifest); a template may be called prompt.
_ONE_OF = {"template": "template", "prompt": "template", "system": "system", "params": "params"}


def _load(name: ModelName, manifest_path: str, root: str, header: bool):
    m = OllamaModel(name=name.display, ref=name, manifest_path=manifest_path)
    try:
        data = yield from _read_all(manifest_path, TEXT_LIMIT)
        if data is None:
            raise ValueError("manifest is larger than 1 MiB: not a manifest")
        m.digest = hashlib.sha256(data).hexdigest()
        m.config_layer, m.layers = parse_manifest(data, root)
    except (ValueError, OSError, SourceError) as e:
        m.error, m.problem = f"{manifest_path}: {e}", Problem.MANIFEST
        return m

    if m.config_layer:
        try:
            config = _read_json((yield from _read_all(m.config_layer.path, TEXT_LIMIT)) or b"{}", "config blob")
            if not isinstance(config, dict):
                raise ValueError("config blob is not a JSON object")
            m.config = config
            _apply_config(m)
        except (ValueError, OSError, SourceError) as e:
            m.warnings.append(f"config blob: {_why(e)}")

    # Each blob is read once, and only those that count: the last template, system and params,
    # and every distinct license (up to LICENSE_LIMIT in all). A manifest may repeat a layer.
    texts, licenses = {}, {}
    for layer in m.layers:
        if layer.kind == "model" and m.model is None:
            m.model = layer
        elif layer.kind == "projector" and m.projector is None:
            m.projector = layer
        elif layer.kind in _ONE_OF:
            texts[_ONE_OF[layer.kind]] = layer
        elif layer.kind == "license":
            licenses.setdefault(layer.path, layer)
    for field_name, layer in texts.items():
        yield from _read_text(m, field_name, layer)
    for layer in licenses.values():
        if not (yield from _read_license(m, layer)):
            break

    if m.model is None:
        if m.layers_of("tensor"):
            m.error = "stored as safetensors tensor layers, not GGUF: not supported here"
            m.problem = Problem.SAFETENSORS
        else:
            m.error = "manifest has no model layer (application/vnd.ollama.image.model)"
            m.problem = Problem.NO_MODEL
        return m

    try:
        size = yield Size(m.model.path)
    except (OSError, SourceError) as e:
        if isinstance(e, FileNotFoundError):
            m.error = f"model blob {m.model.path} is missing: {_why(e)} (re-pull with `ollama pull {m.name}`)"
            m.problem = Problem.MISSING
        else:
            m.error, m.problem = f"model blob {m.model.path} is unreadable: {_why(e)}", Problem.UNREADABLE
        return m
    if size != m.model.size:
        m.error = (f"model blob {m.model.path} is {size} bytes, the manifest says {m.model.size}: "
                   "incomplete or corrupt download")
        m.problem = Problem.INCOMPLETE
        return m
    if header:
        yield from _header(m)
    return m


def _read_text(m: OllamaModel, field_name: str, layer: Layer):
    """Steps: one template, system or params blob into its field (a problem is a warning)."""
    try:
        data = yield from _read_all(layer.path, TEXT_LIMIT)
    except (OSError, SourceError) as e:
        m.warnings.append(f"{layer.kind} blob: {_why(e)}")
        return
    if data is None:
        m.warnings.append(f"{layer.kind} blob is too large to show ({layer.size} bytes)")
    elif field_name == "params":
        try:
            params = _read_json(data, "params blob")
            if not isinstance(params, dict):
                raise ValueError("params blob is not a JSON object")
            m.params = params
        except ValueError as e:
            m.warnings.append(str(e))
    else:
        setattr(m, field_name, data.decode("utf-8", errors="replace"))


def _read_license(m: OllamaModel, layer: Layer):
    """Steps: append a license (a model may carry several) within LICENSE_LIMIT characters in all;
    False once the limit is reached."""
    room = LICENSE_LIMIT - len(m.license or "")
    try:
        data, cut = yield from _read_prefix(layer.path, room)
    except (OSError, SourceError) as e:
        m.warnings.append(f"license blob: {_why(e)}")
        return True
    text = data.decode("utf-8", errors="replace")
    m.license = text if m.license is None else (m.license + "\n\n" + text)[:LICENSE_LIMIT]
    if cut or len(m.license) >= LICENSE_LIMIT:
        m.warnings.append(f"license text cut at {LICENSE_LIMIT >> 10} KiB")
        return False
    return True


def _header(m: OllamaModel):
    if m.projector is not None:       # first: apply_header merges the blob's parts into the projector's
        try:
            found = projector_parts((yield ReadHeader(m.projector.path)).metadata)
            m.parts = tuple(p for p in PARTS if p in found)
        except ImportError:
            raise
        except Exception as e:        # the text model still works without its encoders
            m.warnings.append(f"projector blob {m.projector.path} is not a readable GGUF file: {_why(e)}")
    try:
        apply_header(m, (yield ReadHeader(m.model.path)))
    except ImportError:  # our bug, not the file's
        raise
    except Exception as e:  # any reader failure on a bad file is a per-model error, not a crash
        m.error = f"model blob {m.model.path} is not a readable GGUF file: {_why(e)}"
        m.problem = Problem.UNREADABLE


def _header_unless_read(m: OllamaModel):
    if m.model is not None and not m.header_read:
        yield from _header(m)
    return m


def _why(e: BaseException) -> str:
    if isinstance(e, FileNotFoundError):
        return "file not found"
    return str(e) or type(e).__name__


def _list(header: bool):
    root = yield from _find_root()
    found, broken = yield from _manifest_paths(root)
    models = [OllamaModel(name=name.display, ref=name, manifest_path=path, error=f"{path}: {why}",
                          problem=Problem.MANIFEST) for name, path, why in broken]
    for name, path in found:
        try:
            models.append((yield from _load(name, path, root, header)))
        except ImportError:  # our bug, not the folder's
            raise
        except Exception as e:  # whatever one manifest does, the others still list
            models.append(OllamaModel(name=name.display, ref=name, manifest_path=path,
                                      error=f"{path}: {type(e).__name__}: {_why(e)}", problem=Problem.MANIFEST))
    models.sort(key=lambda m: m.name.lower())
    return models


def _resolve(name: str, header: bool):
    want = ModelName.parse(name)
    root = yield from _find_root()
    path = root + "manifests/" + "/".join(want.parts)
    if (yield Exists(path)):
        found = want
    else:  # names are case-insensitive in Ollama
        candidates, _ = yield from _manifest_paths(root)
        match = [(n, p) for n, p in candidates if n.same(want)]
        if not match:
            have = ", ".join(sorted(n.display for n, _ in candidates)) or "none"
            raise ModelNotFound(f"model {want.display!r} is not in this folder (installed: {have})")
        found, path = match[0]
    return (yield from _load(found, path, root, header))


def _verify(layer: Layer, progress, chunk: int):
    want = blob_path(layer.digest)[len("blobs/sha256-"):]
    try:
        total = yield Size(layer.path)
    except (OSError, SourceError) as e:
        raise OllamaError(f"blob {layer.path} is missing or unreadable: {_why(e)}") from e
    if total != layer.size:
        return False
    h = hashlib.sha256()
    done = 0
    while done < total:
        n = min(chunk, total - done)
        h.update((yield ReadRange(layer.path, done, n)))
        done += n
        if progress:
            progress(done, total)
    return h.hexdigest() == want


# ---------------------------------------------------------------- handlers

class _Handler:
    """Answers the requests above from a directory; the subclass says how files open.

    A file is opened once per run (a model is read in many small pieces) and closed
    when the run ends. Folder requests return what the directory returns: a value,
    or a coroutine that drive_async awaits.
    """

    parse_header: Callable  # read_gguf, or read_gguf_async (one prefix reader, in gguf.py)

    def __init__(self, directory):
        self.directory, self.opened = directory, {}

    def __call__(self, r):
        if isinstance(r, ListDir):
            return self.directory.list(r.path)
        if isinstance(r, Exists):
            return self.directory.exists(r.path)
        if isinstance(r, Size):
            return self.with_file(r.path, lambda src: src.size)
        if isinstance(r, ReadRange):
            return self.with_file(r.path, lambda src: src.read(r.offset, r.n))
        if isinstance(r, ReadHeader):
            return self.with_file(r.path, self.parse_header)
        raise TypeError(f"not an ollama I/O request: {r!r}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for src in self.opened.values():
            if hasattr(src, "close"):
                src.close()


class _SyncHandler(_Handler):
    parse_header = staticmethod(read_gguf)

    def with_file(self, path, use):
        if path not in self.opened:
            self.opened[path] = self.directory.open(path)
        return use(self.opened[path])


class _AsyncHandler(_Handler):
    parse_header = staticmethod(read_gguf_async)

    async def with_file(self, path, use):
        if path not in self.opened:
            self.opened[path] = await self.directory.open(path)
        answer = use(self.opened[path])  # size is a value, read() a coroutine
        return (await answer) if hasattr(answer, "__await__") else answer


def _run(steps, directory):
    """steps.drive over a Directory (or a local path); files opened on the way are closed after."""
    with _SyncHandler(as_directory(directory)) as handle:
        return drive(steps, handle)


async def _run_async(steps, directory: AsyncDirectory):
    """steps.drive_async over an AsyncDirectory."""
    with _AsyncHandler(directory) as handle:
        return await drive_async(steps, handle)


# ---------------------------------------------------------------- public API

def list_models(directory, header: bool = True) -> list[OllamaModel]:
    """Every installed model, sorted by name. Broken ones carry `error`.

    header=False skips the GGUF headers (fast listing); call read_header later.
    """
    return _run(_list(header), directory)


def resolve(directory, name: str, header: bool = True) -> OllamaModel:
    """One model by name: "gemma4", "gemma4:e2b", "me/x:tag", "host/ns/x:tag"."""
    return _run(_resolve(name, header), directory)


def read_header(directory, model: OllamaModel) -> OllamaModel:
    """Fill architecture, quantization, parameter count, context length."""
    return _run(_header_unless_read(model), directory)


def verify_digest(directory, layer: Layer, progress: Callable[[int, int], None] | None = None,
                  chunk: int = HASH_CHUNK) -> bool:
    """Stream the blob through sha256; progress(done_bytes, total_bytes) per chunk."""
    return _run(_verify(layer, progress, chunk), directory)


def open_model(directory, model: OllamaModel) -> ByteSource:
    """The GGUF blob as a byte source (for pyapp.gguf.read_gguf / the engine)."""
    if model.model is None:
        raise OllamaError(model.error or f"{model.name} has no model layer")
    return as_directory(directory).open(model.model.path)


async def list_models_async(directory: AsyncDirectory, header: bool = True) -> list[OllamaModel]:
    return await _run_async(_list(header), directory)


async def resolve_async(directory: AsyncDirectory, name: str, header: bool = True) -> OllamaModel:
    return await _run_async(_resolve(name, header), directory)


async def read_header_async(directory: AsyncDirectory, model: OllamaModel) -> OllamaModel:
    return await _run_async(_header_unless_read(model), directory)


async def verify_digest_async(directory: AsyncDirectory, layer: Layer, progress=None,
                              chunk: int = HASH_CHUNK) -> bool:
    return await _run_async(_verify(layer, progress, chunk), directory)
