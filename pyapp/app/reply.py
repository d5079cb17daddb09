"""A chat turn: the next reply to a conversation, on the loaded model (Gemma 4, or DiffusionGemma by denoising).

The conversation is rendered with the model's chat style (message text stays text: pyapp.chat.render_ids),
refused when it leaves no room in the context, then generated with its events: the prompt to read
(`prefill`, `prefill_done`), the text as it comes (`token`; DiffusionGemma: `denoise` per step too). Stop
(session.stop_requested) ends it at the next step. The reply keeps the ids it was generated as (and their
vocabulary), so the next turn's prompt extends the KV cache exactly.
"""

from __future__ import annotations

import time

from ..chat import render_ids, reply_ids, split_thinking
from ..runtime.soft_tokens import cache_keys
from ..steps import Steps, call
from .adapters import reply_adapter
from .denoise import denoise
from .events import Events
from .audio import audio_token, clip_runs
from .images import image_token, soft_runs
from .session import Refused, Session
from .settings import denoise_params_from_settings, sampling_params


def reply(session: Session, messages: list[dict], settings: dict | None = None, *, params=None,
          thinking: bool = False, events: Events | None = None) -> Steps:
    """Steps: the next assistant reply to `messages` ([{"role", "content"}, ...]). settings: the app's
    settings (pyapp.app.settings; the page's fields), or params: SamplingParams / DenoiseParams the caller
    made (the CLI's flags). Returns the reply: {"text", "answer", "thought", "stop_reason", "ids", "vocab",
    "tokens", "prompt_tokens", "cached", "evaluated", "prefill_s", "decode_tps", "context_used",
    "context_length", ...} (a Gemma 4 reply: the drafts accepted and the adapter; DiffusionGemma: "denoise",
    its steps)."""
    eng = session.loaded()
    events = events or Events()
    if eng.config.is_diffusion:
        return (yield from _denoised_reply(session, eng, messages, settings, params, thinking, events))
    if params is None:
        params = sampling_params(settings or {})
    messages, pictures = with_encoded(messages, "image", session.encoded_images)
    messages, clips = with_encoded(messages, "audio", session.encoded_clips)
    ids = render_ids(eng.tokenizer, messages, add_generation_prompt=True, thinking=thinking, style=session.model.style)
    soft = soft_runs(ids, pictures, image_token(eng.tokenizer)) if pictures else []
    soft += clip_runs(ids, clips, audio_token(eng.tokenizer)) if clips else []
    if len(ids) + 1 >= eng.context_length:
        raise no_room(eng, len(ids), "fills the context")
    session.stop_requested = False
    session.clear_gpu_error()
    new = len(ids) - eng.reusable(cache_keys(ids, soft))
    rate = session.prefill_rate.get(id(eng))
    events.prefill(tokens=new, prompt_tokens=len(ids), eta=new / rate if rate else -1, measured=bool(rate),
                   context_used=len(ids), context_length=eng.context_length)
    res = yield call(eng.generate, ids, params, on_token=token_events(events, len(ids), eng.context_length),
                     should_stop=session.should_stop, on_prefill=events.prefill_done, soft=soft)
    session.check_gpu_accepted("a command during the reply")
    if res.prompt_tokens and res.prefill_s > 0 and res.tokens:      # the next reply's estimate
        session.prefill_rate[id(eng)] = res.prompt_tokens / res.prefill_s
    thought, answer = split_thinking(res.text)
    return {"text": res.text, "answer": answer, "thought": thought, "stop_reason": res.stop_reason,
            **reply_ids(eng.tokenizer, ids, res.tokens), "cached": res.cached_tokens,
            "tokens": len(res.tokens), "prompt_tokens": len(ids), "evaluated": res.prompt_tokens,
            "prefill_s": res.prefill_s, "decode_tps": res.decode_tps, "context_used": eng.n_past + 1,
            "context_length": eng.context_length, "drafted": res.drafted, "accepted": res.accepted,
            "adapter": reply_adapter(session)}


MISSING = {"image": ("images", "missing_images"), "audio": ("clips", "missing_clips")}


def with_encoded(messages: list[dict], kind: str, encoded: dict) -> tuple[list[dict], list]:
    """The messages with each part of `kind` ("image" or "audio": {"type": kind, "key": ...}, a key
    pyapp.app.images.encode_image or pyapp.app.audio.encode_clip gave) given its soft-token count for the
    template, and the encoded inputs in prompt order. One the session no longer holds (a reload, another
    model) is Refused with missing_images / missing_clips: the page adds those again from what it kept and
    retries."""
    out, found, missing = [], [], []
    for m in messages:
        content = m.get("content")
        if not isinstance(content, (list, tuple)) or not any(isinstance(p, dict) and p.get("type") == kind
                                                               for p in content):
            out.append(m)
            continue
        parts = []
        for p in content:
            if isinstance(p, dict) and p.get("type") == kind:
                item = encoded.get(p.get("key"))
                if item is None:
                    missing.append(p.get("key"))
                    continue
                found.append(item)
                p = {**p, "tokens": item.n}
            parts.append(p)
        out.append({**m, "content": parts})
    if missing:
        plural, field_name = MISSING[kind]
        raise Refused(f"{len(missing)} of the conversation's {plural} must be added again (the model was "
                      "loaded again since)", **{field_name: missing})
    return out, found


def no_room(eng, tokens: int, what: str, need: str = "") -> Refused:
    """A conversation too long for the loaded context, in words: what to do about it, Context among the ways
    where the model takes a longer one than it was loaded with."""
    most = eng.config.context_length
    longer = (f", or raise Context (this model takes up to {most:,} tokens) and reload the model"
              if most > eng.context_length else "")
    return Refused(f"The conversation ({tokens:,} tokens) {what} of {eng.context_length:,}{need}; start a new chat "
                   f"or shorten it{longer}")


def token_events(events: Events, prompt_tokens: int, context_length: int):
    """on_token for a reply: each piece of text goes out with the figures so far (tokens, decode tokens/s,
    context used), so they move while the reply streams."""
    count, first = 0, 0.0

    def on_token(tok, text: str) -> None:
        nonlocal count, first
        now = time.perf_counter()
        if tok is not None:              # None: the decoder's last bytes, no new token
            count += 1
            first = first or now
        tps = (count - 1) / (now - first) if count > 1 and now > first else 0.0   # the first waited on the prompt
        events.token(text=text, tokens=count, tps=tps, context_used=prompt_tokens + count,
                     context_length=context_length)
    return on_token


def _denoised_reply(session: Session, eng, messages, settings, params, thinking: bool, events: Events) -> Steps:
    """reply() on a DiffusionGemma model: denoised block by block, each step an event."""
    ids = render_ids(eng.tokenizer, messages, add_generation_prompt=True, thinking=thinking, style=session.model.style)
    room = eng.context_length - len(ids)
    if room < eng.canvas_length:
        raise no_room(eng, len(ids), "leaves no room in the context", f" for a block of {eng.canvas_length}")
    if params is None:
        params = denoise_params_from_settings(eng.config, settings or {}, room)
    reused = eng.reusable(ids)            # what the denoiser keeps of the cache (a chat's earlier turns)
    events.prefill(tokens=len(ids) - reused, prompt_tokens=len(ids), eta=-1, measured=False, denoise=True,
                   context_used=len(ids), context_length=eng.context_length)
    res, live = yield from denoise(session, ids, params, events)
    thought, answer = split_thinking(live.text)
    fig = live.figures()
    return {"text": live.text, "answer": answer, "thought": thought, "stop_reason": res.stop_reason,
            **reply_ids(eng.tokenizer, ids, live.tokens), "cached": reused, "tokens": len(live.tokens),
            "prompt_tokens": len(ids), "evaluated": len(ids) - reused, "prefill_s": 0.0,
            "decode_tps": live.committed / res.seconds if res.seconds > 0 else 0.0,
            "context_used": len(ids) + live.canvas_tokens, "context_length": eng.context_length,
            "denoise": {"steps": fig["steps"], "blocks": len(res.blocks), "block_steps": list(res.steps),
                        "tokens_per_forward": res.tokens_per_forward(params.pad_id)}}


def count_tokens(session: Session, messages: list[dict]) -> dict:
    """How many tokens the conversation takes as a prompt (without the reply's opening), of the context."""
    eng = session.engine
    if eng is None or not messages:
        return {"tokens": 0}
    ids = render_ids(eng.tokenizer, messages, add_generation_prompt=False, style=session.model.style)
    return {"tokens": len(ids), "context_length": eng.context_length}
