"""Generation from token ids, no chat template: the CLI's `generate` (a prompt, templated or --raw) and the
page's golden-output tests (raw ids from an empty cache)."""

from __future__ import annotations

from ..steps import Steps, call
from .events import Events
from .reply import token_events
from .session import Session


def generate(session: Session, ids: list[int], params, events: Events | None = None, stop_ids=None) -> Steps:
    """Steps: the loaded model's GenerationResult after `ids` from an empty cache, its text going out as `token`
    events when events are given. stop_ids: the ids that end it (None: the tokenizer's end-of-turn ids; (): only
    max_tokens and the context)."""
    eng = session.loaded()
    eng.reset()
    session.clear_gpu_error()
    on_token = token_events(events, len(ids), eng.context_length) if events is not None else None
    res = yield call(eng.generate, ids, params, on_token=on_token, stop_ids=stop_ids)
    session.check_gpu_accepted("a command during generation")
    return res
