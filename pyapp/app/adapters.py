"""LoRA adapters (llama.cpp's GGUF format): one checked against the model it is for, chosen for the next load,
switched on or off and scaled between replies (no reload: pyapp.runtime.adapters)."""

from __future__ import annotations

from ..model.config import Gemma4Config
from ..model.lora import load_lora
from ..model.weights import bind
from .session import Refused, Session

MAX_SCALE = 100.0


def check_adapter(gguf, cfg, adapter, scale: float = 1.0):
    """`adapter` (a path, a byte source or a parsed GGUF) checked against the model (its GGUF and config) and
    bound to its weights: the LoraAdapter, whose describe() lists what it adapts. LoraError says why not."""
    return load_lora(adapter, cfg, bind(cfg, gguf.tensors), scale, gguf.architecture)


def choose_adapter(session: Session, g, name: str) -> dict:
    """Check the adapter GGUF `g` against the chosen model; it applies from the next load (the page reloads)."""
    if session.model is None:
        raise Refused(f"Choose the model first: \u201c{name}\u201d is a LoRA adapter, made for one base model.",
                      adapter_error=True)
    model = session.model.gguf
    adapter = check_adapter(model, Gemma4Config.from_gguf(model), g, session.adapter_scale)
    session.adapter = g
    return {"name": name, "lines": adapter.describe(), "on": session.adapter_on, "scale": session.adapter_scale}


def set_adapter(session: Session, on: bool = True, scale=1.0) -> dict | None:
    """Switch the adapter on or off and set its scale: applied from the next reply, no reload. Returns the
    loaded adapter's description (None when none is loaded)."""
    try:
        scale = float(scale)
    except (TypeError, ValueError):
        scale = float("nan")
    if not -MAX_SCALE <= scale <= MAX_SCALE:
        raise Refused("The adapter scale must be a number from -100 to 100 (1 applies it as trained, 0 turns it off).")
    session.adapter_on, session.adapter_scale = bool(on), scale
    eng = session.engine
    if eng is not None and eng.adapters is not None:
        eng.set_lora_scale(0, session.applied_scale)
    return loaded_adapter(session)


def remove_adapter(session: Session) -> None:
    """Forget the adapter; the next load is without it."""
    session.adapter = None


def loaded_adapter(session: Session) -> dict | None:
    """The adapter the loaded engine applies: its name, what it adapts, the switch and scale; None if none."""
    eng = session.engine
    if eng is None or eng.adapters is None:
        return None
    a = eng.adapters.adapters[0]
    return {"name": a.label, "lines": a.describe(), "on": session.adapter_on, "scale": session.adapter_scale}


def reply_adapter(session: Session) -> dict | None:
    """The adapter a reply is generated with (kept with the reply: a conversation can outlive a switch)."""
    eng = session.engine
    if eng.adapters is None or not session.adapter_on or session.adapter_scale == 0:
        return None
    return {"name": eng.adapters.adapters[0].label, "scale": session.adapter_scale}
