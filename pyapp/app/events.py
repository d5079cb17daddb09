"""What a use case reports while it runs: one small callback interface.

The use cases call these methods; a front door overrides those it shows. The page's worker posts
each as an event of the same name and fields (pyapp.webapp.PageEvents -> web/app.js's listeners);
the CLI prints the reply's text as it comes (pyapp.__main__). The defaults do nothing.
"""

from __future__ import annotations


class Events:
    def plan(self, plan) -> None:
        """Loading: the memory plan it follows (pyapp.runtime.memory.MemoryPlan), before anything is uploaded."""

    def progress(self, done: int, total: int, eta: float) -> None:
        """Loading: `done` of `total` bytes are on the GPU; eta: seconds left at the rate so far (-1: unknown)."""

    def compiling(self, done: int, made: int) -> None:
        """Loading, after the upload: `done` of the `made` GPU programs are compiled (the browser compiles them after
        the load has made them; natively they are compiled when made, and this never comes)."""

    def prefill(self, tokens: int, prompt_tokens: int, eta: float, measured: bool, context_used: int,
                context_length: int, denoise: bool = False) -> None:
        """Before a reply: the prompt tokens the model must read first (those the KV cache does not hold) of
        prompt_tokens, and the seconds that should take at the rate of this model's last reply (eta -1,
        measured False: none yet). denoise: a DiffusionGemma reply (its steps come as `denoise`)."""

    def prefill_done(self, done: int, total: int) -> None:
        """The prompt tokens the GPU has read so far, after each prefill chunk but the last."""

    def token(self, text: str, tokens: int, context_used: int, context_length: int, **figures) -> None:
        """A piece of the reply's text, with the figures so far: `tokens` generated, the context used, and
        tps (decode tokens/s); a DiffusionGemma reply's pieces are its committed blocks, with block, steps
        (denoising steps so far), tps (committed tokens/s) and tpf (committed tokens per forward pass)."""

    def denoise(self, block: int, step: int, pieces: list[str], accepted: list[int], steps: int, tps: float,
                tpf: float) -> None:
        """A DiffusionGemma denoising step: the block's argmax draft, one text piece per canvas position, the
        positions accepted (1) so far, and the figures as for `token`. A few KiB: no logits leave the GPU."""
