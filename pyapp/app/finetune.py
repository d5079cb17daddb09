"""Fine-tuning the loaded model, as the page's Fine-tune panel drives it: the training file previewed, a run
started, one update per call (so Stop is taken between updates and the page stays free), then the adapter
of its best parameters. The run (pyapp.train.session.TrainingSession) trains the loaded engine's weights.

Failures name the panel's field at fault where there is one (FieldError; DataError: the data). The CLI's
`finetune` drives the same Trainer in one loop, with checkpoints (pyapp.__main__).
"""

from __future__ import annotations

from .session import Refused, Session


def _run(session: Session):
    """The panel's run; the training modules are imported when the panel is first used."""
    if session.training is None:
        from ..train.session import TrainingSession
        session.training = TrainingSession()
    return session.training


def _trainable(session: Session):
    eng = session.loaded("Load a Gemma 4 model first: fine-tuning trains an adapter for the loaded model.")
    if eng.config.is_diffusion:
        raise Refused("DiffusionGemma models cannot be fine-tuned here: load a Gemma 4 model.")
    return eng


def _running(session: Session):
    run = session.training
    if run is None or not run.running:
        raise Refused("No training run is in progress.")
    return run


def options() -> dict:
    """The panel's presets, targets and field rules (pyapp.train.session.options)."""
    from ..train.session import options
    return options()


def preview(session: Session, source, name: str, fields: dict) -> dict:
    """Read a training file (a byte source; None: the one read before, with changed settings): its statistics
    and warnings, for the panel to show before Start."""
    eng = _trainable(session)
    run = _run(session)
    if run.running:
        raise Refused("A run is in progress: stop it first.")
    data = source.read(0, source.size) if source is not None else None
    return run.load_data(eng, data, name or run.name, fields, session.model.style)


def start(session: Session, fields: dict) -> dict:
    """Make the run's Trainer: the updates it plans and the data it trains on."""
    eng = _trainable(session)
    if eng.adapters is not None:
        raise Refused("Remove the LoRA adapter first: training starts from the base model.")
    if eng.config.is_moe and eng.memory_plan.streams:      # the trainer refuses it in CLI words
        raise Refused("Fine-tuning a mixture-of-experts model needs all its experts in GPU memory, but with this "
                      "GPU memory setting they are read from the file as needed. Raise GPU memory (MiB) in the "
                      "settings (0 puts the whole model on the GPU) and reload the model.", field="gpu_memory")
    session.clear_gpu_error()
    return _run(session).start(eng, fields, session.model.style)


async def step(session: Session) -> dict:
    """One update of the run: its figures (the page calls again for the next, or finish)."""
    report = await _running(session).step()
    session.check_gpu_accepted("a training step")
    return report


async def finish(session: Session) -> dict:
    """End the run: the adapter GGUF of its best parameters (bytes: the page keeps and offers it) and the log;
    the trainer's GPU memory is freed, the model stays loaded."""
    out = await _running(session).finish()
    info = session.model.info
    return {**out, "model": {k: info.get(k) for k in ("name", "file", "digest", "bytes", "architecture")}}
