"""The application layer: the use cases, written once, that both front doors call.

The page's worker (pyapp.webapp: messages in, events out) and the CLI (pyapp.__main__: arguments in,
text out) are thin adapters over these modules:

    session.py   Session: what a front door keeps between use cases (the model chosen and loaded, the
                 LoRA adapter, Stop, the training run); Refused: a use case that cannot run as things are
    events.py    Events: what a use case reports while it runs (load progress, the prompt to read, the
                 reply's text, denoising steps); the page posts them, the CLI prints the text
    settings.py  the app's settings (the page's fields, pyapp.sampling's names) as SamplingParams and
                 DenoiseParams, and their defaults
    model.py     open a model: a GGUF described and chosen (its chat style), loaded onto the GPU with the
                 memory options and adapters
    folder.py    an Ollama models folder: its models listed (or why not, in words), one chosen
    adapters.py  LoRA adapters: checked against the model, chosen, switched and scaled
    reply.py     a chat turn: the next reply to a conversation (Gemma 4, or DiffusionGemma by denoising)
    denoise.py   DiffusionGemma: a generation block by block, its steps and blocks as text and events
    generate.py  generation from token ids (the CLI's generate, the page's golden-output tests)
    logits.py    logits for a token sequence; one denoising step's canvas logits
    finetune.py  the Fine-tune panel's run on the loaded model, one update per call

A use case that runs the GPU is written as steps (pyapp.steps): it yields `call(engine.generate, ...)`,
and the front door runs it with `run` (CPython: the engine's methods) or `await run_async` (the browser:
their `_async` twins). Errors are pyapp.errors.Gemma4Error's; each front door shows them by type.

Standard library only (runs in Pyodide).
"""
