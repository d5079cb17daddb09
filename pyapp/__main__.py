"""Command line: python -m pyapp {info,tokenize,logits,generate,chat,bench,finetune,diffusion-logits} MODEL.gguf ...

See DESIGN.md's "Interfaces other code relies on". A thin adapter over the use cases of pyapp.app
(arguments in, text out): each command parses its options, runs the use case on a Session of its
own and prints what comes back. `--backend reference` runs the numpy oracle instead (CPython only);
`native` runs our WGSL kernels through wgpu-native.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from .app.events import Events
from .errors import Gemma4Error


def _open(path):
    from .gguf import read_gguf
    return read_gguf(path)


def _tokenizer(gguf):
    from .tokenizer import Tokenizer
    return Tokenizer.from_metadata(gguf.metadata)


def _loras(args) -> list:
    """[(adapter path, user scale)] from --lora (repeatable) and --lora-scale (one for all, or one each);
    none for a command without these options (diffusion-logits)."""
    from .model.config import ConfigError
    paths, scales = getattr(args, "lora", None) or [], getattr(args, "lora_scale", None) or []
    if scales and not paths:
        raise ConfigError("--lora-scale needs --lora ADAPTER.gguf")
    if len(scales) not in (0, 1, len(paths)):
        raise ConfigError(f"give one --lora-scale for all adapters or one per --lora ({len(paths)}), not {len(scales)}")
    return [(p, scales[i] if len(scales) > 1 else scales[0] if scales else 1.0) for i, p in enumerate(paths)]


class _Printer(Events):
    """The use cases' events as the CLI shows them: the memory plan on stderr, the reply's text on stdout."""

    def plan(self, plan):
        print("\n".join(plan.describe()), file=sys.stderr)

    def token(self, text, *_, **__):
        sys.stdout.write(text)
        sys.stdout.flush()


class _BlockPrinter(Events):
    """A DiffusionGemma generation's events: each committed block's text as it comes, and a line per block to
    stderr with the denoising steps it took."""
    steps = 0

    def denoise(self, block, step, *_, **__):
        self.steps = step

    def token(self, text, *_, block=0, **__):
        sys.stdout.write(text)
        sys.stdout.flush()
        print(f"\n[block {block + 1}: {self.steps} denoising steps]", file=sys.stderr)


def _loaded(gguf, args, events=None):
    """A Session with the model loaded on the native GPU, with the memory options and --lora adapters; the
    memory plan goes to stderr first."""
    from .app import model
    from .app.session import Session
    from .steps import run
    session = Session()
    model.choose(session, gguf)
    if getattr(args, "draft_model", None):      # checked now, refused before the model loads; loaded with it
        run(model.add_drafter(session, _open(args.draft_model), args.draft_model))
    run(model.load(session, events or _Printer(), context_length=getattr(args, "context", None),
                   gpu_memory_mib=args.gpu_memory, expert_cache_mib=args.expert_cache,
                   ple_in_file=True if args.ple_in_file else None, lora=_loras(args),
                   int8=not getattr(args, "no_int8", False), f16=getattr(args, "f16", False),
                   prompt_step=args.prompt_step))
    return session


def cmd_info(args) -> int:
    from .engine import EngineError
    from .gguf import summarize
    from .families import model_config
    from .families.diffusion_gemma import diffusion_summary
    from .model.config import ConfigError
    g = _open(args.model)
    s = summarize(g)
    print(f"file:          {args.model}")
    print(f"GGUF version:  {g.version}, {len(g.tensors)} tensors, {s['total_bytes'] / 2**20:.1f} MiB of tensor data")
    print(f"architecture:  {g.architecture}")
    for key in ("general.name", "general.file_type", "general.size_label"):
        if key in g.metadata:
            print(f"{key + ':':<15}{g.metadata[key]}")
    if summary := diffusion_summary(g.metadata):
        print(f"model:         {summary}")
    from .model.forms import file_form
    for line in file_form(g.metadata, g.tensors).describe():
        print(line)
    try:
        cfg = model_config(g)
        print(f"config:        {cfg.describe()}")
        for line in _memory_plan(g, args).describe():
            print(line)
        for path, scale in _loras(args):
            for line in _adapter_lines(g, cfg, path, scale):
                print(line)
    except (ConfigError, EngineError) as e:
        print(f"config:        not runnable here: {e}")
    print("tensor types:")
    for name, row in sorted(s["by_type"].items(), key=lambda kv: -kv[1]["bytes"]):
        print(f"  {name:<8} {row['count']:>5} tensors {row['bytes'] / 2**20:>10.2f} MiB")
    print(f"parameters:    {s['n_elements']:,}")
    return 0


def _adapter_lines(g, cfg, path, scale) -> list[str]:
    """What `info --lora` says of an adapter: its targets, or why it does not load on this model."""
    from .app.adapters import check_adapter
    from .model.lora import LoraError
    try:
        return check_adapter(g, cfg, path, scale).describe()
    except LoraError as e:
        return [f"LoRA adapter:  {path}: refused: {e}"]


def _memory_plan(g, args):
    """The memory plan `info` shows, under WebGPU's default limits."""
    from .engine import Engine
    limits = {"max_storage_buffer_binding_size": 128 << 20, "max_buffer_size": 256 << 20}
    return Engine.plan(g, limits, args.context, args.gpu_memory, args.expert_cache,
                       True if args.ple_in_file else None, chunk=args.prompt_step,
                       int8=not getattr(args, "no_int8", False))


def cmd_tokenize(args) -> int:
    tok = _tokenizer(_open(args.model))
    print(" ".join(map(str, tok.encode(args.text, add_bos=args.bos))))
    return 0


def _token_ids(text: str, vocab: int, what: str = "token") -> list[int]:
    """Comma-separated ids in ASCII digits, each inside the vocabulary (InputError names the bad one)."""
    from .inputs import token_ids
    return token_ids(text, vocab, what)


def cmd_logits(args) -> int:
    import numpy as np
    gguf = _open(args.model)
    from .model.config import ConfigError, Gemma4Config
    if _is_diffusion(gguf):
        raise ConfigError("DiffusionGemma scores its canvas, not a next token: use diffusion-logits (one "
                          "denoising step's logits), generate or chat")
    tokens = _token_ids(args.tokens, Gemma4Config.from_gguf(gguf).vocab_size)
    images = [_read_image(path, args.image_tokens) for path in args.image or ()]
    clips = [_read_audio(path) for path in args.audio or ()]
    projector = _open(args.mmproj) if args.mmproj else None
    if args.backend == "reference":
        from .reference.forward import ReferenceModel
        soft = _reference_soft(gguf, projector, args.mmproj, tokens, images, clips) if images or clips else None
        logits = ReferenceModel(gguf, lora=_loras(args)).forward(tokens, soft=soft)
    else:
        from .app.logits import logits as logits_of
        from .steps import run
        session = _loaded(gguf, args)
        session.projector, session.projector_name = projector, args.mmproj
        soft = run(_soft_runs(session, tokens, images, args.image_tokens)) if images else []
        soft += run(_clip_runs(session, tokens, clips)) if clips else []
        logits = run(logits_of(session, tokens, soft))
    logits = np.asarray(logits, dtype=np.float32)      # engine and reference: Logits
    np.save(args.out, logits)
    print(f"wrote {args.out}: {logits.shape[0]} x {logits.shape[1]} float32 ({args.backend})")
    return 0


def _read_image(path: str, budget: int):
    """An image file decoded and prepared for the encoder at `budget` soft tokens (preprocess.Prepared)."""
    from .families.gemma4_vision.preprocess import check_budget, decode, prepare
    from .inputs import read_file
    check_budget(budget)
    rgb, width, height = decode(read_file(path, MAX_IMAGE_BYTES, "image"))
    return prepare(rgb, width, height, budget)


MAX_IMAGE_BYTES = 64 << 20          # a photo is a few MiB; past this it is not an image a person attaches


def _image_token(gguf) -> int:
    from .app.images import image_token
    from .tokenizer import Tokenizer
    return image_token(Tokenizer.from_metadata(gguf.metadata))


def _soft_runs(session, tokens, images, budget):
    """Steps: the SoftRuns of the images at their placeholder runs, encoded on the GPU."""
    from .app.images import encode_image, soft_runs
    from .families.gemma4_vision.preprocess import to_rgba
    encoded = []
    for image in images:
        encoded.append((yield from encode_image(session, to_rgba(image.rgb, image.width, image.height),
                                                image.width, image.height, budget)))
    return soft_runs(tokens, encoded, _image_token(session.model.gguf))


def _reference_soft(gguf, projector, projector_name, tokens, images, clips):
    """(positions, rows, both ways) of the images' and clips' soft tokens by the numpy encoders, for
    ReferenceModel.forward (an image's rows both ways where the model's images attend so, a clip's never);
    each encoder found as the GPU path finds it (a projector checked to be this model's)."""
    import numpy as np
    from .runtime.soft_tokens import placeholder_starts
    at, rows = [], []
    if images:
        from .families.gemma4_vision.preprocess import patchify
        from .families.gemma4_vision.reference import reference_encoder
        from .families.gemma4_vision.source import find_image_encoder
        enc = reference_encoder(find_image_encoder(gguf, projector, projector_name=projector_name).gguf)
        at += placeholder_starts(tokens, [im.tokens for im in images], _image_token(gguf))
        for im in images:
            patches, positions = patchify(im.rgb, im.width, im.height, enc.patch)    # the 12B's are 48 px
            rows.append(enc.features(np.frombuffer(patches, np.float32).reshape(len(positions), -1),
                                     np.array(positions)))
    if clips:
        from .families.gemma4_audio.reference import reference_encoder
        from .families.gemma4_audio.source import find_audio_encoder
        enc = reference_encoder(find_audio_encoder(gguf, projector, projector_name=projector_name).gguf)
        at += placeholder_starts(tokens, [enc.soft_tokens(len(c.samples)) for c in clips], _audio_token(gguf), "clip")
        rows += [enc.clip_features(c.samples) for c in clips]
    both_ways = [np.full(len(r), i < len(images)) for i, r in enumerate(rows)]
    return (np.concatenate([np.arange(a, a + len(r)) for a, r in zip(at, rows)]), np.concatenate(rows),
            np.concatenate(both_ways))


def _read_audio(path: str):
    """A WAV file read as a 16 kHz mono clip (pyapp.families.gemma4_audio.wav.Clip), at least 10 ms long; a
    note on stderr when it is longer than the 30 s Gemma 4 hears."""
    from .app.audio import clip_tokens
    from .families.gemma4_audio.features import MAX_SECONDS
    from .families.gemma4_audio.wav import read_wav
    from .inputs import read_file
    clip = read_wav(read_file(path, MAX_AUDIO_BYTES, "audio file", "Gemma 4 hears 30 s at most: cut the clip"),
                    max_seconds=MAX_SECONDS)
    clip_tokens(len(clip.samples))
    if clip.source_seconds > MAX_SECONDS:
        print(f"note: {path} is {clip.source_seconds:.1f} s long; Gemma 4 hears its first {MAX_SECONDS} s",
              file=sys.stderr)
    return clip


MAX_AUDIO_BYTES = 1 << 30          # 30 s of 8-channel 384 kHz float64 is 737 MiB: past this it is not a clip


def _audio_token(gguf) -> int:
    from .app.audio import audio_token
    from .tokenizer import Tokenizer
    return audio_token(Tokenizer.from_metadata(gguf.metadata))


def _clip_runs(session, tokens, clips):
    """Steps: the SoftRuns of the clips at their placeholder runs, encoded on the GPU."""
    from .app.audio import clip_runs, encode_clip
    encoded = []
    for clip in clips:
        encoded.append((yield from encode_clip(session, clip.samples)))
    return clip_runs(tokens, encoded, _audio_token(session.model.gguf))


def cmd_diffusion_logits(args) -> int:
    """One DiffusionGemma denoising step's [canvas, vocab] logits after encoding the prompt."""
    import numpy as np
    from .families.diffusion_gemma import DiffusionGemmaConfig
    gguf = _open(args.model)
    cfg = DiffusionGemmaConfig.from_gguf(gguf)
    prompt = _token_ids(args.prompt_tokens, cfg.vocab_size, "prompt token")
    canvas = _token_ids(args.canvas_tokens, cfg.vocab_size, "canvas token")
    prev = None
    if args.prev_logits:                # a regular .npy of finite floats, its header checked before its data
        from .inputs import load_logits
        prev = load_logits(args.prev_logits, len(canvas), cfg.vocab_size)
    if args.backend == "reference":
        from .families.diffusion_gemma.reference import DiffusionReference
        logits = DiffusionReference(gguf, cfg).decoder_step(prompt, canvas, prev)
    else:
        from .app.logits import diffusion_logits
        from .steps import run
        logits = run(diffusion_logits(_loaded(gguf, args), prompt, canvas, None if prev is None else prev.tobytes()))
    logits = np.asarray(logits, dtype=np.float32)
    np.save(args.out, logits)
    print(f"wrote {args.out}: {logits.shape[0]} x {logits.shape[1]} float32 ({args.backend})")
    return 0


def _chat_style(gguf):
    from .app.model import chat_style
    return chat_style(gguf)


def _prompt_ids(tok, gguf, text: str, raw: bool) -> list[int]:
    if raw:
        return tok.encode(text, add_bos=True)
    from .chat import render_ids
    return render_ids(tok, [{"role": "user", "content": text}], style=_chat_style(gguf))


def _is_diffusion(gguf) -> bool:
    from .model.config import DIFFUSION_ARCH
    return gguf.metadata.get("general.architecture") == DIFFUSION_ARCH


def _denoise_params(args, gguf):
    """DiffusionGemma's settings: the model's defaults (its GGUF), overridden by the flags given."""
    from .app.settings import denoise_params
    from .families.diffusion_gemma import DiffusionGemmaConfig
    fields = {"steps": args.steps, "t_min": args.t_min, "t_max": args.t_max, "entropy_bound": args.entropy_bound,
              "stability_threshold": args.stability, "confidence_threshold": args.confidence}
    return denoise_params(DiffusionGemmaConfig.from_gguf(gguf), fields,
                          args.max_tokens if args.max_tokens > 0 else None, args.seed)


def _generate_diffusion(args, g, tok, ids) -> int:
    from .app.denoise import DenoisedText, denoise
    params = _denoise_params(args, g)          # checked before the model loads
    if args.backend == "reference":
        from .families.diffusion_gemma import SeededDraws
        from .families.diffusion_gemma.reference import DiffusionReference, generate
        model = DiffusionReference(g)
        live = DenoisedText(tok, params, len(ids), model.cfg.context_length, _BlockPrinter())
        res = generate(model, ids, params, SeededDraws(params.seed, model.cfg.vocab_size, model.cfg.canvas_length),
                       on_step=live.on_step)
        for b, block in enumerate(res.blocks):
            live.on_block(b, block)
        live.finish()
    else:
        from .steps import run
        res, live = run(denoise(_loaded(g, args), ids, params, _BlockPrinter()))
    sys.stdout.write(live.tail + "\n")
    speed = (f", {sum(t != params.pad_id for t in res.tokens) / res.seconds:.1f} tok/s" if res.seconds else "")
    print(f"[{len(res.blocks)} blocks, {res.decoder_passes} denoising steps, {res.tokens_per_forward(params.pad_id):.2f} "
          f"tokens per forward{speed}, {res.stop_reason}]", file=sys.stderr)
    return 0


def cmd_generate(args) -> int:
    g = _open(args.model)
    tok = _tokenizer(g)
    ids = _prompt_ids(tok, g, args.prompt, args.raw)
    if _is_diffusion(g):
        if args.image or args.audio:
            from .model.config import ConfigError
            raise ConfigError("DiffusionGemma takes text only: leave out --image and --audio")
        return _generate_diffusion(args, g, tok, ids)
    params = _params(args)       # checked before the model loads
    if args.image or args.audio:
        return _generate_with_media(args, g, params)
    if args.backend == "reference":
        from .reference.forward import ReferenceModel
        out = ReferenceModel(g, lora=_loras(args)).generate_greedy(ids, int(min(params.token_limit, args.context)))
        print(tok.decode([t for t in out if t not in tok.stop_ids]))
        return 0
    from .app.generate import generate
    from .steps import run
    printer = _Printer()
    res = run(generate(_loaded(g, args, printer), ids, params, printer))
    sys.stdout.write("\n")
    print(f"[{res.prompt_tokens} prompt tokens in {res.prefill_s:.2f}s, {len(res.tokens)} generated at "
          f"{res.decode_tps:.1f} tok/s, {res.stop_reason}{_speculation_note(params, res)}]", file=sys.stderr)
    return 0


def _generate_with_media(args, g, params) -> int:
    """generate with --image / --audio: one user turn, the images and clips before the prompt's text, through
    the chat use case."""
    from .app.reply import reply
    from .model.config import ConfigError
    from .steps import run
    if args.raw:
        raise ConfigError("--raw takes no --image or --audio: the chat template places them (or give the "
                          "placeholder runs yourself to `logits --image/--audio`)")
    if args.backend == "reference":
        raise ConfigError("--backend reference generates from text only; `logits --image/--audio --backend "
                          "reference` scores a prompt with them")
    images = [_read_image(path, args.image_tokens) for path in args.image or ()]
    clips = [_read_audio(path) for path in args.audio or ()]
    projector = _open(args.mmproj) if args.mmproj else None
    printer = _Printer()
    session = _loaded(g, args, printer)
    session.projector, session.projector_name = projector, args.mmproj
    content = run(_media_parts(session, images, clips, args.image_tokens)) + [{"type": "text", "text": args.prompt}]
    r = run(reply(session, [{"role": "user", "content": content}], params=params, events=printer))
    sys.stdout.write("\n")
    clip_tokens = [session.encoded_clips[p["key"]].n for p in content if p["type"] == "audio"]
    print(f"[{r['prompt_tokens']} prompt tokens ({_soft_share(images, clip_tokens)}) in {r['prefill_s']:.2f}s, "
          f"{r['tokens']} generated at {r['decode_tps']:.1f} tok/s, {r['stop_reason']}]", file=sys.stderr)
    return 0


def _soft_share(images, clip_tokens: list[int]) -> str:
    """How many prompt tokens the images and clips (their soft tokens given) took: "60 of them the images',
    30 the clips'"."""
    shares = []
    if images:
        shares.append((sum(i.tokens for i in images), "the images'"))
    if clip_tokens:
        shares.append((sum(clip_tokens), "the clips'"))
    (n, whose), *rest = shares
    return f"{n} of them {whose}" + "".join(f", {m} {other}" for m, other in rest)


def _media_parts(session, images, clips, budget):
    """Steps: each prepared image and each clip encoded on the GPU, as a message's image and audio parts."""
    from .app.audio import encode_clip
    from .app.images import encode_image
    from .families.gemma4_vision.preprocess import to_rgba
    parts = []
    for image in images:
        encoded = yield from encode_image(session, to_rgba(image.rgb, image.width, image.height), image.width,
                                          image.height, budget)
        parts.append({"type": "image", "key": encoded.key})
    for clip in clips:
        encoded = yield from encode_clip(session, clip.samples)
        parts.append({"type": "audio", "key": encoded.key})
    return parts


def _speculation_note(params, res) -> str:
    """What speculative decoding did, for the summary line (nothing when it was off)."""
    if not params.speculate:
        return ""
    if not params.speculates:
        return "; speculative decoding is off: greedy only (--temperature 0, --repeat-penalty 1)"
    return (f"; speculative: {res.accepted} of {res.drafted} drafted tokens accepted, "
            f"{res.tokens_per_step:.2f} tokens per step")


def _params(args):
    from .engine import SamplingParams
    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                          repeat_penalty=args.repeat_penalty, repeat_last_n=args.repeat_last_n,
                          max_tokens=args.max_tokens, seed=args.seed, speculate=_drafts(args))


def _drafts(args) -> int:
    """Drafts a step: --speculate N (0: off, with a drafter too), else DRAFTER_DRAFTS with --draft-model."""
    from .sampling import DRAFTER_DRAFTS
    if args.speculate is None:
        return DRAFTER_DRAFTS if getattr(args, "draft_model", None) else 0
    return args.speculate


def cmd_chat(args) -> int:
    from .app.reply import reply
    from .chat import Conversation
    from .steps import run
    g = _open(args.model)
    params = _denoise_params(args, g) if _is_diffusion(g) else _params(args)   # checked before the model loads
    if (args.image or args.audio) and _is_diffusion(g):
        from .model.config import ConfigError
        raise ConfigError("DiffusionGemma takes text only: leave out --image and --audio")
    images = [_read_image(path, args.image_tokens) for path in args.image or ()]   # checked before the model loads
    clips = [_read_audio(path) for path in args.audio or ()]
    printer = _Printer()
    session = _loaded(g, args, printer)
    session.projector = _open(args.mmproj) if args.mmproj else None
    session.projector_name = args.mmproj
    parts = run(_media_parts(session, images, clips, args.image_tokens)) if images or clips else []
    conv = Conversation(system=args.system, style=session.model.style)
    carried = [f"{len(images)} image(s)"] * bool(images) + [f"{len(clips)} clip(s)"] * bool(clips)
    print("Gemma 4 chat. Empty line or Ctrl-D quits; Ctrl-C stops a reply."
          + (f" The first message carries {' and '.join(carried)}." if carried else ""))
    while True:
        try:
            text = input("> ")
        except EOFError:
            break
        if not text.strip():
            break
        conv.add_user(text, parts)
        parts = []
        try:
            r = run(reply(session, conv.all_messages(), params=params, events=printer))
        except KeyboardInterrupt:
            print("\n[stopped]")
            conv.pop_last()
            continue
        sys.stdout.write("\n")
        conv.add_assistant(r["text"], {"ids": r["ids"], "vocab": r["vocab"]})
    return 0


def cmd_bench(args) -> int:
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))   # the benchmarks live in bench/
    from engine_bench import bench
    g = _open(args.model)
    engine = _loaded(g, args).engine
    result = bench(engine, prompt_tokens=args.prompt_tokens, gen_tokens=args.decode_tokens, repeat=args.repeat,
                   speculate=_drafts(args), prompt=args.prompt_kind)
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k}: {v}")
    return 0


def _train_config(args):
    """The preset (default quick) with every option given on the command line put over it."""
    from dataclasses import fields, replace
    from .train.trainer import PRESETS
    given = {f.name: getattr(args, f.name) for f in fields(PRESETS[args.preset])
             if getattr(args, f.name, None) is not None}
    return replace(PRESETS[args.preset], **given)


def _clock(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def cmd_finetune(args) -> int:
    """Train a LoRA adapter on the GPU; each update prints loss, tokens/s and time left. The checkpoint
    (--checkpoint, default OUT.ckpt) is written every --val-every updates and at the end; Ctrl-C stops
    after writing it and the best adapter so far."""
    from .train.checkpoint import load_checkpoint
    from .train.data import load_dataset
    from .train.files import write_atomic
    from .train.trainer import Trainer
    config = _train_config(args)
    config.check()
    g = _open(args.model)
    tok = _tokenizer(g)
    from .inputs import read_file
    from .train.data import MAX_DATA_BYTES
    data = read_file(args.data, MAX_DATA_BYTES, "--data", "split the examples over smaller runs, or keep the most "
                     "useful ones")
    ds = load_dataset(data, args.data, tok, config.seq_len, style=_chat_style(g), val_fraction=config.val_fraction,
                      seed=config.seed)
    st = ds.stats
    print(f"{st.n_examples} examples ({st.format}): {st.n_train} to train on ({st.train_tokens} tokens, "
          f"{st.train_targets} counted), {st.n_val} held out", file=sys.stderr)
    for w in ds.warnings:
        print(f"warning: {w}", file=sys.stderr)
    ckpt_path = args.checkpoint or args.out + ".ckpt"
    resume = load_checkpoint(ckpt_path) if args.resume else None
    engine = _loaded(g, args).engine
    tr = Trainer(engine, ds, config, checkpoint=resume)
    print(f"training {tr.params.n_trainable:,} values ({len(tr.params.pairs)} pairs, rank {config.rank}) for "
          f"{tr.total_steps} updates of {config.batch} sequences" + (f", from update {tr.step}" if resume else ""),
          file=sys.stderr)

    def save() -> None:
        write_atomic(ckpt_path, [tr.checkpoint_bytes()])
        write_atomic(args.out, [tr.adapter_gguf(best=True)])

    try:
        while not tr.done:
            r = tr.train_step()
            val = f"  val {r.val_loss:.4f}" if r.val_loss is not None else ""
            print(f"step {r.step}/{r.total_steps}  loss {r.loss:.4f}{val}  lr {r.lr:.2e}  |g| {r.grad_norm:.3f}  "
                  f"{r.tokens_per_s:,.0f} tok/s  left {_clock(r.eta_s)}", flush=True)
            if r.step % config.val_every == 0:
                save()
    except KeyboardInterrupt:
        print("\n[stopped]", file=sys.stderr)
    save()
    best = f", best validation loss {tr.best_val_loss:.4f} at update {tr.best_step}" if tr.best_step and \
        tr.best_val_loss != float("inf") else ""
    print(f"wrote {args.out} (LoRA adapter, llama.cpp format){best}; checkpoint {ckpt_path}", file=sys.stderr)
    tr.close()
    return 0


def _memory_args(p) -> None:
    p.add_argument("--gpu-memory", type=_number, metavar="MIB",
                   help="GPU memory budget: what does not fit stays in the file (the per-layer embedding "
                        "table, then experts, streamed into a cache); default: everything on the GPU")
    p.add_argument("--expert-cache", type=_number, metavar="MIB",
                   help="GPU memory for cached experts of a mixture-of-experts model (the rest stream from the file)")
    p.add_argument("--ple-in-file", action="store_true",
                   help="keep the per-layer embedding table (E2B/E4B) in the file and read one row per token: "
                        "less GPU memory, slower decode")
    p.add_argument("--prompt-step", type=_integer, metavar="TOKENS",
                   help="the most prompt tokens one step reads (default: 2048 where the context is longer and "
                        "the GPU memory plan has room, else 512; 1120 for 26B-A4B and 31B, whose images must fit "
                        "one step): larger steps read long prompts faster and take more GPU memory (E2B on an "
                        "H200, a 16,000-token prompt: 2.07 s in steps of 512, 1.89 s in steps of 2048 for 724 MiB "
                        "more)")
    p.add_argument("--no-int8", action="store_true",
                   help="every matmul and matvec in f32 (default: steps of more than 64 prompt tokens multiply "
                        "Q4_K, Q4_0, Q5_0 and Q8_0 weights, and decoding Q4_K weights and the experts, by "
                        "activations rounded to int8 per 32, as llama.cpp does: faster prefill and decode, "
                        "logits within that rounding)")
    p.add_argument("--f16", action="store_true",
                   help="the prefill matmuls that int8 does not take (other weight types, steps of at most 64 "
                        "tokens) in f16 where the GPU has shader-f16: weights and activations rounded to f16 "
                        "(at most 65504), sums in f32 every 32 weights; faster there, logits within f16's rounding")


def _speculate_arg(p) -> None:
    from .sampling import MAX_SPECULATE
    p.add_argument("--speculate", type=_integer, default=None, metavar="N",
                   help=f"speculative decoding: draft up to N tokens (0-{MAX_SPECULATE}) by prompt lookup (the "
                        "tokens that followed the latest earlier occurrence of the last 3, 2 or 1 tokens) and check "
                        "them in one step: the greedy tokens (up to float rounding), faster where text repeats "
                        "(code, quoting the prompt, lists). Greedy only: off with --temperature > 0 or "
                        "--repeat-penalty != 1 (default 0: off)")
    p.add_argument("--draft-model", dest="draft_model", metavar="FILE",
                   help="an assistant drafter (a gemma-4-*-it-assistant GGUF, llama.cpp's converter) that drafts "
                        "on the GPU beside the model instead of prompt lookup; --speculate N then defaults to "
                        "4 drafts a step")


def _number(text: str) -> float:
    """A float option's value written in ASCII digits (pyapp.inputs.number: float() would take "1_0" and "٤").
    nan, inf and 1e400 pass as floats: the option's own rule refuses them, naming its range (every float option
    has one: sampling.RULES, trainer.RULES, DenoiseParams.validate, lora.check_user_scale, engine._mib)."""
    from .inputs import InputError, number
    try:
        return number(text, finite=False)
    except InputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _integer(text: str) -> int:
    """An integer option's value in ASCII digits (pyapp.inputs.integer: int() would take "1_0" and "٤")."""
    from .inputs import InputError, integer
    try:
        return integer(text)
    except InputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


class _Parser(argparse.ArgumentParser):
    """argparse that takes "-1e30", "-5e-3", "-.5" and "-inf" after an option as its value: stock argparse
    sees only "-1" and "-1.5" as numbers and says "expected one argument" to the rest, so a negative scale in
    exponent form never reached the check that says what is wrong with it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^-(inf|infinity|nan)$",
                                                   re.IGNORECASE)


def _lora_args(p) -> None:
    p.add_argument("--lora", action="append", metavar="ADAPTER.gguf",
                   help="apply a LoRA adapter in llama.cpp's GGUF format (repeatable: adapters add up)")
    p.add_argument("--lora-scale", action="append", type=_number, metavar="S",
                   help="user scale of the adapter(s): delta = S * alpha / rank * B A (default 1; 0: off)")


def _image_args(p, what: str) -> None:
    from .families.gemma4_vision.config import BUDGETS, DEFAULT_BUDGET
    p.add_argument("--image", action="append", metavar="FILE", help=f"an image (PNG, JPEG, WebP, ...; repeatable): {what}")
    p.add_argument("--image-tokens", type=_integer, default=DEFAULT_BUDGET, metavar="N",
                   help=f"soft tokens an image may take: {', '.join(map(str, BUDGETS))} (default {DEFAULT_BUDGET})")
    p.add_argument("--mmproj", metavar="FILE", default=None,
                   help="the projector file (llama.cpp's mmproj-*.gguf: the image and audio encoders), for a model "
                        "file without them")


def _audio_args(p, what: str) -> None:
    p.add_argument("--audio", action="append", metavar="FILE.wav",
                   help="a WAV clip (PCM 8/16/24/32-bit or float, any rate, mono or stereo; its first 30 s; "
                        f"repeatable): {what}")


def parser() -> argparse.ArgumentParser:
    """The command line: every command, its options and their defaults (tests build their arguments here too)."""
    ap = _Parser(prog="python -m pyapp", description="Gemma 4 on WebGPU")
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("info", help="architecture, hyperparameters, tensor/quant summary")
    p.add_argument("model")
    p.add_argument("--context", type=_integer, default=None, help="context length the memory plan assumes")
    _memory_args(p)
    _lora_args(p)
    p.set_defaults(fn=cmd_info)

    p = sub.add_parser("tokenize", help="print token ids (no BOS unless --bos)")
    p.add_argument("model")
    p.add_argument("--text", required=True)
    p.add_argument("--bos", action="store_true")
    p.set_defaults(fn=cmd_tokenize)

    p = sub.add_parser("logits", help="write float32 [n_tokens, vocab] logits to .npy")
    p.add_argument("model")
    p.add_argument("--tokens", required=True, help="comma-separated token ids")
    p.add_argument("--out", required=True)
    p.add_argument("--backend", choices=["native", "reference"], default="native")
    _image_args(p, "the tokens hold its placeholder run as Gemma 4's processor writes it: <|image>, one "
                   "<|image|> per soft token, <image|>")
    _audio_args(p, "the tokens hold its placeholder run: <|audio>, one <|audio|> per 40 ms, <audio|>")
    _memory_args(p)
    _lora_args(p)
    p.set_defaults(fn=cmd_logits)

    p = sub.add_parser("diffusion-logits", help="DiffusionGemma: one denoising step's [canvas, vocab] logits to .npy")
    p.add_argument("model")
    p.add_argument("--prompt-tokens", required=True, help="comma-separated prompt token ids (encoded first)")
    p.add_argument("--canvas-tokens", required=True, help="comma-separated canvas token ids")
    p.add_argument("--prev-logits", default=None, help=".npy of the previous step's processed logits [canvas, vocab]")
    p.add_argument("--out", required=True)
    p.add_argument("--backend", choices=["native", "reference"], default="native")
    p.add_argument("--context", type=_integer, default=None, help="context length (KV cache size)")
    _memory_args(p)
    p.set_defaults(fn=cmd_diffusion_logits)

    from .engine import DEFAULT_CONTEXT, SamplingParams
    base = SamplingParams()     # the CLI differs only in being greedy and shorter by default
    for name, fn in (("generate", cmd_generate), ("chat", cmd_chat)):
        p = sub.add_parser(name)
        p.add_argument("model")
        if name == "generate":
            p.add_argument("--prompt", required=True)
            p.add_argument("--raw", action="store_true", help="no chat template")
        else:
            p.add_argument("--system", default=None)
        p.add_argument("--max-tokens", type=_integer, default=256, help="-1: until a stop token or the context is full")
        p.add_argument("--temperature", type=_number, default=0.0)
        p.add_argument("--top-k", type=_integer, default=base.top_k)
        p.add_argument("--top-p", type=_number, default=base.top_p)
        p.add_argument("--min-p", type=_number, default=base.min_p)
        p.add_argument("--repeat-penalty", type=_number, default=base.repeat_penalty)
        p.add_argument("--repeat-last-n", type=_integer, default=base.repeat_last_n)
        p.add_argument("--seed", type=_integer, default=0)
        _speculate_arg(p)
        p.add_argument("--context", type=_integer, default=DEFAULT_CONTEXT, help="context length (KV cache size)")
        p.add_argument("--backend", choices=["native", "reference"], default="native")
        _memory_args(p)
        _image_args(p, "placed before the prompt's text" if name == "generate" else "in the first message")
        _audio_args(p, "placed after the images, before the prompt's text" if name == "generate"
                    else "in the first message")
        d = p.add_argument_group("DiffusionGemma (default: the model's settings)")
        d.add_argument("--steps", type=_integer, default=None, help="most denoising steps per block")
        d.add_argument("--t-min", type=_number, default=None, help="temperature of the last step")
        d.add_argument("--t-max", type=_number, default=None, help="temperature of the first step")
        d.add_argument("--entropy-bound", type=_number, default=None,
                       help="accept the lowest-entropy positions while their summed entropy stays under this")
        d.add_argument("--stability", type=_integer, default=None,
                       help="stop a block once its argmax has not changed for this many steps (and is confident)")
        d.add_argument("--confidence", type=_number, default=None,
                       help="stop a block once the mean entropy is below this (and it is stable)")
        _lora_args(p)
        p.set_defaults(fn=fn)

    p = sub.add_parser("bench", help="prefill and decode tokens/s")
    p.add_argument("model")
    p.add_argument("--json", action="store_true")
    p.add_argument("--prompt-tokens", type=_integer, default=128)
    p.add_argument("--decode-tokens", type=_integer, default=64)
    p.add_argument("--repeat", type=_integer, default=3, help="timed runs after the warm-up (medians are reported)")
    p.add_argument("--prompt-kind", choices=["random", "repeat"], default="random",
                   help="the prompt: random token ids, or a random block of 16 ids repeated (text that repeats)")
    _speculate_arg(p)
    p.add_argument("--context", type=_integer, default=2048)
    p.add_argument("--backend", choices=["native"], default="native")
    _memory_args(p)
    _lora_args(p)
    p.set_defaults(fn=cmd_bench)

    p = sub.add_parser("finetune", help="train a LoRA adapter (llama.cpp's format) on the GPU")
    p.add_argument("model")
    p.add_argument("--data", required=True, metavar="FILE.jsonl",
                   help='training data: JSONL chats ({"messages": [...]}, loss on the assistant replies) or text')
    p.add_argument("--out", required=True, metavar="ADAPTER.gguf", help="where the adapter goes")
    p.add_argument("--preset", choices=["quick", "thorough"], default="quick",
                   help="starting settings (quick: rank 8, 1 epoch, lr 2e-4, batch 4; thorough: rank 16, 3 "
                        "epochs, lr 1e-4, batch 8); the options below override them")
    p.add_argument("--rank", type=_integer)
    p.add_argument("--alpha", type=_number)
    p.add_argument("--targets", help="projections to adapt: q,k,v,o,gate,up,down,ple_gate,ple_proj,router "
                                     "(router: a MoE model's; default q,k,v,o,gate,up,down)")
    p.add_argument("--steps", type=_integer, help="updates (default: --epochs passes over the data)")
    p.add_argument("--epochs", type=_number)
    p.add_argument("--lr", type=_number, help="peak learning rate (warmup, then cosine decay)")
    p.add_argument("--batch", type=_integer, help="sequences per update")
    p.add_argument("--seq-len", dest="seq_len", type=_integer, help="longest sequence in tokens (longer examples are cut)")
    p.add_argument("--warmup", type=_integer, help="warmup updates (default: a tenth)")
    p.add_argument("--weight-decay", dest="weight_decay", type=_number)
    p.add_argument("--max-grad-norm", dest="max_grad_norm", type=_number, help="gradient clipping (0: off)")
    p.add_argument("--val-fraction", dest="val_fraction", type=_number, help="held-out share of the examples")
    p.add_argument("--val-every", dest="val_every", type=_integer, help="updates between validation losses and checkpoints")
    p.add_argument("--seed", type=_integer)
    p.add_argument("--checkpoint", metavar="FILE", help="checkpoint file (default: OUT.ckpt)")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint")
    p.add_argument("--context", type=_integer, default=None, help=argparse.SUPPRESS)
    p.add_argument("--backend", choices=["native"], default="native")
    _memory_args(p)
    p.set_defaults(fn=cmd_finetune)
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except (Gemma4Error, OSError) as e:   # ours carry the message a user needs; OSError: a path given
        print(f"error: {e}", file=sys.stderr)
        if getattr(e, "hint", ""):          # what to do next, where the raiser gave it apart
            print(e.hint, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
