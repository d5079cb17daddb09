"""One small GPU interface, two backends (native wgpu-py, browser navigator.gpu).

The engine talks only to `Device`, `Buffer`, `Pipeline`, `BindGroup` and `Plan`:

    dev = get_device()                              # or await get_device_async()
    w = dev.buffer(n_bytes)                         # storage, COPY_DST|COPY_SRC
    dev.upload(w, source, offset, n_bytes)          # chunked from a ByteSource
    p = dev.pipeline("matvec", prelude=quant_prelude("Q4_0"), constants={...})
    bg = dev.bind_group(p, {"W": w, "X": x, "Y": y})  # by the WGSL variable names
    plan = dev.plan(); plan.dispatch(p, bg, rows)   # built once per shape
    plan.dispatch(p, bg, rows, indirect=(args, 0))  # or: counts (x, y, z) read from an "indirect" buffer
    dev.submit(plan)                                # replayed per token: one submit
    ids = dev.read(out, 0, 4)                       # await dev.read_async(...) in the browser

Command buffers are single use in WebGPU, so a Plan is a list of dispatches and
copies that the backend re-encodes on every submit (the browser backend does it
in one JS call, so a token costs a handful of FFI crossings, not one per op).
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass, field

from ..errors import Gemma4Error

SHADER_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "shaders")

# Upload chunk: big enough to amortise calls, small enough for wasm32's heap.
UPLOAD_CHUNK = 8 << 20


class GPUError(Gemma4Error):
    """No adapter, a lost device, or a shader/pipeline the device rejects."""


@dataclass(eq=False)
class Buffer:
    handle: object
    size: int
    kind: str
    label: str = ""


@dataclass(eq=False)
class Pipeline:
    handle: object
    key: tuple                                               # (shader, entry, prelude, constants)
    bindings: dict[str, int] = field(default_factory=dict)   # WGSL variable name -> @binding of group 0

    @property
    def label(self) -> str:
        return f"{self.key[0]}:{self.key[1]}"


@dataclass(eq=False)
class BindGroup:
    handle: object
    values: tuple = ()     # what a Device.uniform_values buffer bound in it holds (a kernel's shape), for profiles


@dataclass(eq=False)
class Plan:
    """Dispatches and copies in submission order; re-encoded on every submit."""

    ops: list = field(default_factory=list)
    _native: object = None  # backend cache (e.g. the JS arrays), dropped on change

    def dispatch(self, pipeline: Pipeline, bind_group: BindGroup, x: int, y: int = 1, z: int = 1,
                 indirect: tuple[Buffer, int] | None = None) -> "Plan":
        """(x, y, z) workgroups; indirect = (buffer, offset): as many as the three u32 there say when the
        plan runs (a buffer of kind "indirect"), x, y, z then the most it may say."""
        self.ops.append(("d", pipeline, bind_group, int(x), int(y), int(z), indirect))
        self._native = None
        return self

    def copy(self, src: Buffer, src_offset: int, dst: Buffer, dst_offset: int, size: int) -> "Plan":
        self.ops.append(("c", src, int(src_offset), dst, int(dst_offset), int(size)))
        self._native = None
        return self


# WebGPU limits the engine cares about, snake_case. Both backends fill them.
LIMIT_NAMES = (
    "max_buffer_size", "max_storage_buffer_binding_size", "max_uniform_buffer_binding_size",
    "max_storage_buffers_per_shader_stage", "max_compute_workgroup_storage_size",
    "max_compute_invocations_per_workgroup", "max_compute_workgroup_size_x",
    "max_compute_workgroups_per_dimension", "min_storage_buffer_offset_alignment",
    "min_uniform_buffer_offset_alignment",
)


def load_wgsl(name: str) -> str:
    path = os.path.join(SHADER_DIR, name if name.endswith(".wgsl") else name + ".wgsl")
    with open(path, encoding="utf-8") as f:
        return f.read()


_INCLUDE = re.compile(r"^//!include\s+(\S+)\s*$", re.M)


def shader_source(name: str, prelude: str = "") -> str:
    """WGSL of shaders/<name>.wgsl with `//!include other` lines expanded, after `prelude` (whose own
    include lines are expanded too: a prelude can pick the implementation of a function the file calls)."""
    seen: set[str] = set()

    def expand(n: str) -> str:
        if n in seen:
            return ""
        seen.add(n)
        return _INCLUDE.sub(lambda m: expand(m.group(1)), load_wgsl(n))

    return _INCLUDE.sub(lambda m: expand(m.group(1)), prelude) + "\n" + expand(name)


_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
# one or more attributes, then `var` [<address space, access>] NAME
_RESOURCE = re.compile(r"((?:@\w+\s*\([^)]*\)\s*)+)var\b\s*(?:<[^>]*>)?\s*(\w+)")


def binding_numbers(source: str) -> dict[str, int]:
    """{variable name: n} of every `@group(0) @binding(n) var ... NAME` in WGSL source."""
    out = {}
    for m in _RESOURCE.finditer(_COMMENT.sub("", source)):
        group = re.search(r"@group\s*\(\s*(\d+)", m.group(1))
        binding = re.search(r"@binding\s*\(\s*(\d+)", m.group(1))
        if group and binding and int(group.group(1)) == 0:
            out[m.group(2)] = int(binding.group(1))
    return out


SOFTWARE_ADAPTERS = {"swiftshader": "SwiftShader", "llvmpipe": "llvmpipe", "lavapipe": "lavapipe",
                     "warp": "Microsoft WARP", "basic render": "Microsoft Basic Render Driver"}


def software_adapter(info: dict) -> str | None:
    """The name of a software (CPU) adapter, or None for a GPU: the browser's fallback adapter, or one whose
    name says it renders on the CPU (SwiftShader, llvmpipe, ...)."""
    described = " ".join(str(info.get(k, "")) for k in ("vendor", "architecture", "description", "device")).lower()
    for key, name in SOFTWARE_ADAPTERS.items():
        if key in described:
            return name
    return "the browser's fallback adapter" if info.get("fallback") else None


class Device:
    """Backend-independent device. Subclasses implement the `_`-prefixed hooks."""

    backend = "?"
    # Whether the 32-weight-block int8 units (quants_dot_x8.wgsl: Q4_0, Q5_0, Q8_0) beat f32 x here: on the
    # H100, Dawn's compiler (the browser path) runs E2B Q4_0's decode 1.47x faster with them, naga (native
    # wgpu) 1.42x slower (bench/RESULTS.md, eleventh session)
    int8_block_units = False

    def __init__(self):
        self.info: dict = {}
        self.features: set[str] = set()
        self.limits: dict[str, int] = {}
        self._pipelines: dict[tuple, Pipeline] = {}
        self._sources: dict[str, str] = {}
        self._uniform_values: dict[tuple, Buffer] = {}
        self._values_of: dict[int, tuple] = {}      # id of a uniform_values buffer -> its values
        self.allocated_bytes = 0      # every buffer created so far (none is freed by us: a running peak)

    # -- capabilities ------------------------------------------------------
    @property
    def cpu_adapter(self) -> bool:
        """Whether the adapter renders on the CPU (software_adapter: lavapipe, SwiftShader, Chrome's fallback),
        where every workgroup costs its start however little it does (~1 ms with barriers on SwiftShader):
        there a dispatch sized by the step's position (indirect) beats one sized for the whole context. On a
        GPU the indirect dispatches cost more than the empty workgroups they save (E2B's decode step 2,356 ->
        2,580 us with its decode attention so sized, H200, browser path; bench/RESULTS.md, twentieth session)."""
        return software_adapter(self.info) is not None

    @property
    def has_f16(self) -> bool:
        return "shader-f16" in self.features

    @property
    def has_subgroups(self) -> bool:
        return "subgroups" in self.features

    def enables(self, *exts: str) -> str:
        """WGSL `enable` lines for these extensions ('f16', 'subgroups'), as this backend wants them."""
        return "".join(f"enable {e};\n" for e in exts)

    # -- health (the browser backend overrides these) ---------------------
    @property
    def lost_reason(self) -> str | None:
        """Why the device was lost ('destroyed: ...'), or None while it works."""
        return None

    @property
    def last_error(self) -> str | None:
        """The latest uncaptured validation/out-of-memory error message since clear_error(), if any."""
        return None

    def clear_error(self) -> None:
        """Forget last_error (before work whose errors the caller wants to see)."""

    def describe(self) -> str:
        i = self.info
        return f"{self.backend}: {i.get('vendor', '?')} {i.get('device') or i.get('architecture') or i.get('description', '')}".strip()

    # -- buffers -----------------------------------------------------------
    def buffer(self, size: int, kind: str = "storage", label: str = "") -> Buffer:
        """kind: storage (read/write, copy src+dst), uniform (copy dst), readback (map read), indirect
        (dispatch counts, copy dst)."""
        if kind not in ("storage", "uniform", "readback", "indirect"):
            raise ValueError(f"unknown buffer kind {kind!r}")
        size = max(16, (int(size) + 15) & ~15)  # writes/copies need 4-byte multiples; 16 suits vec4
        if size > self.limits.get("max_buffer_size", size):
            raise GPUError(f"buffer {label or ''} of {size} bytes exceeds the device's maxBufferSize "
                           f"({self.limits['max_buffer_size']}); split the tensor")
        buf = Buffer(self._create_buffer(size, kind, label), size, kind, label)
        self.allocated_bytes += size
        return buf

    @property
    def dummy(self) -> Buffer:
        """A small storage buffer to fill bindings a pipeline declares but won't read."""
        if getattr(self, "_dummy", None) is None:
            self._dummy = self.buffer(256, label="dummy")
        return self._dummy

    @property
    def dummy_out(self) -> Buffer:
        """As dummy, for a writable binding a pipeline declares but won't write (bound beside
        dummy in one bind group: a writable binding may not alias another)."""
        if getattr(self, "_dummy_out", None) is None:
            self._dummy_out = self.buffer(256, label="dummy out")
        return self._dummy_out

    def uniform_values(self, *values: int) -> Buffer:
        """A uniform buffer of these u32 values, made once a tuple: a kernel's shape read at run time rather
        than set by override constants, so one pipeline serves every shape (a pipeline is a compile: seconds
        each on a CPU rasterizer, and the model's load waits for them)."""
        buf = self._uniform_values.get(values)
        if buf is None:
            buf = self._uniform_values[values] = self.buffer(4 * len(values), "uniform",
                                                             "values " + " ".join(map(str, values)))
            self.write(buf, struct.pack(f"<{len(values)}I", *values))
            self._values_of[id(buf)] = values
        return buf

    def write(self, buf: Buffer, data, offset: int = 0) -> None:
        """Queue a write of bytes-like `data` (padded to 4 bytes) at `offset`."""
        mv = memoryview(data).cast("B")
        if len(mv) % 4:
            mv = memoryview(bytes(mv) + bytes(4 - len(mv) % 4))
        if offset % 4:
            raise GPUError(f"buffer writes need 4-byte aligned offsets, got {offset}")
        if offset + len(mv) > buf.size:
            raise GPUError(f"write of {len(mv)} bytes at {offset} overflows buffer {buf.label} ({buf.size})")
        self._write(buf, offset, mv)

    def upload(self, buf: Buffer, source, src_offset: int, n: int, dst_offset: int = 0,
               chunk: int = UPLOAD_CHUNK) -> None:
        """Copy n bytes of a ByteSource (`read(offset, n)`) into buf, one chunk at a time."""
        chunk &= ~3  # every chunk but the last lands on a 4-byte aligned offset
        done = 0
        while done < n:
            k = min(chunk, n - done)
            self.write(buf, source.read(src_offset + done, k), dst_offset + done)
            done += k

    async def upload_async(self, buf: Buffer, source, src_offset: int, n: int, dst_offset: int = 0,
                           chunk: int = UPLOAD_CHUNK) -> None:
        """As upload(), for sources whose read() is a coroutine (browser Blobs)."""
        chunk &= ~3
        done = 0
        while done < n:
            k = min(chunk, n - done)
            data = source.read(src_offset + done, k)
            if hasattr(data, "__await__"):
                data = await data
            self.write(buf, data, dst_offset + done)
            done += k

    def upload_many(self, source, copies: list) -> None:
        """upload() of each (buffer, src_offset, n, dst_offset)."""
        for buf, src_offset, n, dst_offset in copies:
            self.upload(buf, source, src_offset, n, dst_offset)

    async def upload_many_async(self, source, copies: list) -> None:
        """upload_async() of each (buffer, src_offset, n, dst_offset); the browser's reads overlap."""
        for buf, src_offset, n, dst_offset in copies:
            await self.upload_async(buf, source, src_offset, n, dst_offset)

    # -- pipelines ---------------------------------------------------------
    def pipeline(self, shader: str, entry: str = "main", constants: dict | None = None,
                 prelude: str = "") -> Pipeline:
        """Compute pipeline from shaders/<shader>.wgsl; cached by (shader, entry, prelude, constants).

        `prelude` is WGSL prepended to the file (type aliases, const block sizes);
        `constants` set the file's `override` declarations.
        """
        consts = tuple(sorted((constants or {}).items()))
        key = (shader, entry, prelude, consts)
        p = self._pipelines.get(key)
        if p is None:
            src = shader_source(shader, prelude)
            p = Pipeline(self._create_pipeline(src, entry, dict(consts), f"{shader}:{entry}"), key,
                         binding_numbers(src))
            self._pipelines[key] = p
        return p

    def pipeline_from_source(self, source: str, label: str, entry: str = "main",
                             constants: dict | None = None) -> Pipeline:
        """An uncached compute pipeline from WGSL source (bench probes; the engine's shaders go by name)."""
        consts = dict(sorted((constants or {}).items()))
        return Pipeline(self._create_pipeline(source, entry, consts, label), (label, entry, source, tuple(consts.items())),
                        binding_numbers(source))

    def programs_ready(self, progress=None, cancelled=None) -> None:
        """Return once every pipeline made so far is compiled (natively they are when made), or once cancelled()."""

    async def programs_ready_async(self, progress=None, cancelled=None) -> None:
        """programs_ready, awaited (the browser: its GPU process compiles after the calls return)."""
        self.programs_ready(progress, cancelled)

    def bind_group(self, pipeline: Pipeline, resources: dict) -> BindGroup:
        """Bind @group(0) by the shader's variable names: {"X": resource, ...}, where a resource
        is a Buffer or (Buffer, offset, size). Name exactly the bindings the entry point uses:
        its auto layout holds those only, and both Dawn and wgpu reject a mismatch."""
        entries, values = [], ()
        for name, r in resources.items():
            i = pipeline.bindings.get(name)
            if i is None:
                raise GPUError(f"{pipeline.label} has no binding named {name!r} "
                               f"(it declares {', '.join(sorted(pipeline.bindings)) or 'none'})")
            if isinstance(r, Buffer):
                entries.append((i, r, 0, r.size))
                values = self._values_of.get(id(r), values)
            else:
                b, off, size = r
                entries.append((i, b, int(off), int(size)))
        return BindGroup(self._create_bind_group(pipeline, entries), values)

    # -- work --------------------------------------------------------------
    def plan(self) -> Plan:
        return Plan()

    def submit(self, plan: Plan) -> None:
        self._submit(plan)

    def read(self, buf: Buffer, offset: int = 0, size: int | None = None) -> bytes:
        """Synchronous readback (native only); waits for all submitted work."""
        raise GPUError(f"{self.backend} backend cannot read synchronously; use read_async")

    async def read_async(self, buf: Buffer, offset: int = 0, size: int | None = None) -> bytes:
        return self.read(buf, offset, size)

    def read_mapped(self, buf: Buffer, offset: int = 0, size: int | None = None) -> bytes:
        """Bytes of a readback buffer that a submitted plan copied into. Waits only for the work
        that wrote it, not for later submissions: the GPU can run ahead while the CPU reads."""
        raise GPUError(f"{self.backend} backend cannot read synchronously; use read_mapped_async")

    async def read_mapped_async(self, buf: Buffer, offset: int = 0, size: int | None = None) -> bytes:
        return self.read_mapped(buf, offset, size)

    # -- profiling (bench/gpu_profile.py) -----------------------------------
    def time_plan_gpu(self, plan: Plan, repeat: int = 5, per_dispatch: bool = False) -> dict:
        """GPU time of a plan by timestamp queries (needs "timestamp-query"), encoded `repeat` times:
        {"cpu_ms": each encode + submit on the CPU, "ns": timestamps in order}: per submit the
        first pass's start and the last pass's end, or (per_dispatch) every dispatch in a pass
        of its own, its start and end."""
        raise GPUError(f"{self.backend} backend cannot time plans synchronously; use time_plan_gpu_async")

    async def time_plan_gpu_async(self, plan: Plan, repeat: int = 5, per_dispatch: bool = False) -> dict:
        return self.time_plan_gpu(plan, repeat, per_dispatch)

    # -- backend hooks -----------------------------------------------------
    def _create_buffer(self, size: int, kind: str, label: str): raise NotImplementedError
    def _write(self, buf: Buffer, offset: int, data: memoryview): raise NotImplementedError
    def _create_pipeline(self, source: str, entry: str, constants: dict, label: str): raise NotImplementedError
    def _create_bind_group(self, pipeline: Pipeline, entries: list): raise NotImplementedError
    def _submit(self, plan: Plan): raise NotImplementedError


def get_device(backend: str = "auto") -> Device:
    """A ready device: 'native' (wgpu-py), 'browser' (needs await: use get_device_async) or 'auto'."""
    if backend in ("auto", "native"):
        try:
            from .native import NativeDevice
        except ImportError as e:
            if backend == "native":
                raise GPUError(f"native GPU backend needs the 'wgpu' package: {e}") from e
        else:
            return NativeDevice.create()
    raise GPUError("the browser backend is asynchronous: use `await get_device_async('browser')`")


async def get_device_async(backend: str = "auto") -> Device:
    """As get_device; in Pyodide ('auto' or 'browser') requests navigator.gpu's adapter."""
    import sys
    if backend == "browser" or (backend == "auto" and sys.platform == "emscripten"):
        from .browser import BrowserDevice
        return await BrowserDevice.create()
    return get_device(backend)
