"""DiffusionGemma: a reply written by denoising, block after block, each step shown.

`DenoisedText` turns the engine's (or the numpy reference's) per-step and per-block callbacks into the
reply's text and the events the front doors show: per step ("denoise") the block's argmax draft as one
text piece per canvas position and the acceptance mask; per committed block ("token") its text, up to
the first end-of-turn. `denoise` runs one generation on the session's engine.
"""

from __future__ import annotations

import time

from ..families.diffusion_gemma import DenoiseParams, ReplayDraws
from ..steps import Steps, call
from .events import Events
from .session import Refused, Session


class DenoisedText:
    """A DiffusionGemma reply as it is committed: its tokens (up to the first eos), its text, and the figures
    so far (steps taken, committed tokens per second and per forward pass)."""

    def __init__(self, tok, params: DenoiseParams, prompt_tokens: int, context_length: int,
                 events: Events | None = None):
        self.tok, self.decoder, self.events = tok, tok.stream(), events or Events()
        self.eos, self.pad = set(params.eos_ids), params.pad_id
        self.prompt_tokens, self.context_length = prompt_tokens, context_length
        self.pieces: dict[int, str] = {}       # id -> its text (a draft repeats ids step after step)
        self.tokens: list[int] = []             # the reply: committed ids up to the first eos
        self.text, self.passes, self.committed, self.canvas_tokens, self.ended = "", 0, 0, 0, False
        self.tail = ""
        self.t0 = time.perf_counter()

    def _piece(self, t: int) -> str:
        if t not in self.pieces:
            self.pieces[t] = "" if t in self.eos else self.tok.decode([t])
        return self.pieces[t]

    def figures(self) -> dict:
        seconds = time.perf_counter() - self.t0
        return {"steps": self.passes, "tps": self.committed / seconds if seconds > 0 else 0.0,
                "tpf": self.committed / self.passes if self.passes else 0.0}

    def on_step(self, block: int, step: int, argmax, accepted) -> None:
        self.passes += 1
        self.events.denoise(block=block, step=step, pieces=[self._piece(t) for t in argmax],
                            accepted=[1 if a else 0 for a in accepted], **self.figures())

    def on_block(self, block: int, ids) -> None:
        self.committed += sum(t != self.pad for t in ids)       # transformers' tokens_per_forward counts these
        self.canvas_tokens += len(ids)
        piece = ""
        for t in ids:
            if self.ended or t in self.eos:
                self.ended = True
                break
            self.tokens.append(t)
            piece += self.decoder.push(t)
        self.text += piece
        self.events.token(text=piece, tokens=len(self.tokens), context_used=self.prompt_tokens + self.canvas_tokens,
                          context_length=self.context_length, block=block, **self.figures())

    def finish(self) -> str:
        """The decoder's last bytes, the end of the text (kept as `tail`): added to `text`, and returned."""
        self.tail = self.decoder.flush()
        self.text += self.tail
        return self.tail


def denoise(session: Session, ids: list[int], params: DenoiseParams, events: Events | None = None) -> Steps:
    """Steps: one generation on the session's DiffusionGemma engine after the prompt ids (the cache keeps
    what it holds of them: a chat's earlier turns); Stop takes effect between steps. Returns the engine's
    DenoiseResult and the DenoisedText that followed it (finished)."""
    eng = session.loaded()
    live = DenoisedText(eng.tokenizer, params, len(ids), eng.context_length, events)
    session.stop_requested = False
    res = yield call(eng.denoise, ids, params, on_step=live.on_step, on_block=live.on_block,
                     should_stop=session.should_stop)
    live.finish()
    return res, live


def diffusion_engine(session: Session):
    """The session's engine if it is a DiffusionGemma one (Refused otherwise)."""
    eng = session.engine
    if eng is None or not eng.config.is_diffusion:
        raise Refused("No DiffusionGemma model loaded")
    return eng


def replay(session: Session, prompt: list[int], fields: dict, draws: dict | None = None) -> Steps:
    """Steps: one generation from an empty cache with these DenoiseParams fields (the model's defaults for the
    rest) and, when given, recorded random draws {init, sample, renoise} (ReplayDraws): the engine's
    DenoiseResult, every step's decisions (tests replay transformers' generate)."""
    eng = diffusion_engine(session)
    eng.reset()
    recorded = ReplayDraws(draws["init"], draws["sample"], draws["renoise"]) if draws else None
    return (yield call(eng.denoise, prompt, DenoiseParams.from_config(eng.config, **fields), recorded))
