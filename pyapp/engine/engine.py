"""The engine: a Gemma 4 GGUF on the GPU, prompt in, tokens out.

    eng = Engine.open("model.gguf")                     # CPython, native wgpu (the file's family's engine)
    eng = await Engine.open_async(gguf, device)         # Pyodide, navigator.gpu
    res = eng.generate(prompt_ids, SamplingParams(temperature=0), on_token=print)

Weights go from the file to the GPU in chunks (in the browser Blob.slice ->
writeBuffer inside JS), never whole through Python. The KV cache is allocated
once for `context_length`; a new prompt that starts with the tokens already
cached (the next turn of a chat) only pays for its new tokens.

Loading (pyapp.engine.loading), generation (pyapp.engine.decode, and
pyapp.engine.speculative when it drafts) and logits are each written once, as
generators of requests (pyapp.runtime.requests: copy file bytes to the GPU,
read a GPU buffer), driven by pyapp.steps: `drive` natively, `drive_async` in
the browser, where reading a buffer back is asynchronous. The methods that
return such steps (`generation`, `timed_step`) are public, for callers that
compose them (bench/engine_bench.py) and drive them with `drive` / `drive_async`.
"""

from __future__ import annotations

from ..gpu import Device
from ..model.logits import Logits
from ..runtime.loaded import EngineError, LoadedModel
from ..runtime.requests import handler
from ..runtime.soft_tokens import cache_keys
from ..sampling import SamplingParams
from ..steps import drive, drive_async
from . import decode, loading, speculative


class Engine(LoadedModel):
    # -- loading ------------------------------------------------------------------
    @classmethod
    def open(cls, model, backend: str = "native", context_length: int | None = None, chunk: int | None = None,
             progress=None, cancelled=None, device: Device | None = None, **memory) -> LoadedModel:
        """Load a GGUF (path, ByteSource or parsed GGUFFile) onto a native GPU device; returns its family's
        engine (pyapp.families: an Engine, or the family's own, e.g. a DiffusionEngine). memory: gpu_memory_mib, expert_cache_mib, ple_in_file, on_plan, lora, int8, f16, beside (pyapp.engine.loading.load)."""
        from ..gguf import GGUFFile, read_gguf
        from ..gpu import get_device
        gguf = model if isinstance(model, GGUFFile) else read_gguf(model)
        dev = device or get_device(backend)
        return drive(loading.load(dev, gguf, cls, context_length, chunk, progress, cancelled, **memory),
                     handler(dev, gguf.source))

    @classmethod
    async def open_async(cls, gguf, device: Device, context_length: int | None = None, chunk: int | None = None,
                         progress=None, cancelled=None, **memory) -> LoadedModel:
        """Load in the browser. gguf.source: a sync ByteSource (FileReaderSync, for per-token
        PLE rows) with a `.blob` (the File) so weights go Blob -> GPU inside JS."""
        return await drive_async(loading.load(device, gguf, cls, context_length, chunk, progress, cancelled, **memory),
                                 handler(device, gguf.source, asynchronous=True))

    @staticmethod
    def plan(gguf, limits: dict, context_length: int | None = None, gpu_memory_mib: float | None = None,
             expert_cache_mib: float | None = None, ple_in_file: bool | None = None, chunk: int | None = None,
             beside: int = 0, int8: bool = True):
        """The MemoryPlan loading would follow (see pyapp.engine.loading.load's options), without a GPU."""
        return loading.plan(gguf, limits, context_length, chunk, gpu_memory_mib, expert_cache_mib, ple_in_file,
                            beside, int8)[3]

    # -- generation -------------------------------------------------------------------
    def generation(self, prompt: list[int], params: SamplingParams | None = None, on_token=None, should_stop=None,
                   stop_ids=None, on_prefill=None, soft=()):
        """Steps of one generation (see generate); returns its GenerationResult."""
        params = (params or SamplingParams()).validate()        # fields may have changed since it was made
        # the speculative check picks argmax over every token; a model with suppressed tokens decodes
        # one token a step, through the sampler that leaves them out
        loop = speculative if params.speculates and not self.config.suppress_tokens else decode
        return loop.generation(self, prompt, params, on_token, should_stop, stop_ids, on_prefill, soft)

    def generate(self, prompt: list[int], params: SamplingParams | None = None, on_token=None,
                 should_stop=None, stop_ids=None, on_prefill=None, soft=()):
        """Sample until a stop token (default: the tokenizer's end-of-turn ids), max_tokens,
        should_stop() or the context end. on_token(id, text) streams decoded text; on_prefill(done,
        total): the prompt tokens the GPU has read, after each of its chunks but the last; soft: soft
        tokens in place of placeholders (pyapp.runtime.soft_tokens.SoftRun: an image's)."""
        return self.drive(self.generation(prompt, params, on_token, should_stop, stop_ids, on_prefill, soft))

    async def generate_async(self, prompt: list[int], params: SamplingParams | None = None, on_token=None,
                             should_stop=None, stop_ids=None, on_prefill=None, soft=()):
        return await self.drive_async(self.generation(prompt, params, on_token, should_stop, stop_ids, on_prefill,
                                                      soft))

    def timed_step(self, ids: list[int], pos: int, few: bool = False):
        """Steps: what one step of ids at pos costs alone, with its greedy head (pyapp.engine.speculative)."""
        return speculative.timed_step(self, ids, pos, few)

    # -- logits (tests, CLI) --------------------------------------------------------
    def _forward(self, tokens: list[int], soft=()):
        """Steps: logits of every position, from an empty cache (soft: SoftRuns in place of placeholders)."""
        tokens = [int(t) for t in tokens]
        if len(tokens) > self.context_length:
            raise EngineError(f"{len(tokens)} tokens do not fit the context of {self.context_length}")
        soft = self.check_soft(tokens, soft)
        self.reset()
        rows = []

        def logits_of_step(n: int):
            for row in range(n):
                rows.append((yield from self.runner.logits(row)))

        yield from self.feed(tokens, 0, after_each=logits_of_step, soft=soft)
        self.cached = cache_keys(tokens, soft)
        return Logits.from_rows(rows)

    def forward(self, tokens: list[int], soft=()) -> Logits:
        """Logits for every position (softcap applied), as the reference's forward returns them."""
        return self.drive(self._forward(tokens, soft))

    async def forward_async(self, tokens: list[int], soft=()) -> Logits:
        return await self.drive_async(self._forward(tokens, soft))
