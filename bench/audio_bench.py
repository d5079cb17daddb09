"""Audio input speed (issue 30): the time to turn a 10 s and a 30 s clip into soft tokens, and the time to
first token of a prompt with one clip, natively (wgpu-native), on an audio projector file and the text
model of the same width.

    python bench/audio_bench.py --mmproj /tmp/mmproj-audio-bench-e2b.gguf --text /tmp/bench-e2b-Q4_K.gguf \\
        --seconds 10 30 --repeat 5 --wav-dir /tmp/h100/audio
    python bench/audio_bench.py --mmproj /tmp/mmproj-audio-tiny.gguf --seconds 2 --repeat 2      # quick check

The clip: a synthetic 16 kHz mono 16-bit WAV (a rising chirp, a steady tone and a little noise, the
same samples on every run), written to --wav-dir as clip-SECONDS.wav for llama.cpp's llama-mtmd-cli
and read back here with the app's WAV reader, so both sides hear the same samples. 30 s is the most
Gemma 4 hears in one clip (750 soft tokens); llama.cpp's gemma4a preprocessing cuts audio into 30 s
chunks (mtmd-audio.cpp, 30 x 16000 samples each), so a 30 s clip is one chunk there too.

Prints one JSON object per line:

  {"kind": "audio_features", ...}  per clip: `features_ms` the median time of the log-mel features in
      Python (pyapp.families.gemma4_audio.features.log_mel: standard library only; `python` says which
      Python): the numpy reference's features; the app computes them on the GPU inside encode_clip
  {"kind": "audio_encode", ...}  per clip, one AudioEncoder (opened once, as the app opens it: one plan for
      clips up to 30 s): `first_ms` the first encode of that clip, then `repeat` encodes: `encode_ms` the
      median wall time of AudioEncoder.encode_clip as the app calls it (the samples uploaded, the log-mel
      rows on the GPU: shaders/log_mel.wgsl, the plan submitted, the soft tokens copied out) until 4 bytes
      of its output are read back (all GPU work done), `runs_ms` each; `gpu_ms` the median GPU time of the
      encoder's plan alone (the features' dispatch apart) by timestamp queries (first pass's start to the
      last pass's end), when the device has them; `total_ms` = encode_ms (samples to soft tokens)
  {"kind": "audio_ttft", ...}  per clip, with the text model loaded: the prompt the chat template makes of
      one user message (the clip, then "Transcribe."), `ttft_ms` the median wall time from the samples
      to the first token read back: features + encode + prefill + the first token (greedy), nothing
      synchronised in between; `encode_ms` and `prefill_ms` the two parts, from runs that wait for the
      encoder's output before generating

Each measurement: one warm-up, then --repeat runs (median). The KV cache is reset before every run.

--llama ONE.log [ONE.log ...] --many MANY.log: instead of measuring, llama-mtmd-cli's logs (fresh processes
with the clip once; one with the clip --clips times in the prompt) as an audio_llama record (llama_record).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from vision_bench import gpu_time_ms, llama_log, ms, span_ms, text_engine_async  # noqa: E402  (the image bench's helpers)

PROMPT_TEXT = "Transcribe."
RATE = 16_000


def synthetic_clip(seconds: float, seed: int = 0):
    """A speech-band test signal, float32 in [-1, 1]: a chirp rising from 150 Hz to 3 kHz over the clip,
    a 440 Hz tone that comes and goes every second, and a little noise."""
    import numpy as np
    n = int(round(seconds * RATE))
    t = np.arange(n) / RATE
    f0, f1 = 150.0, 3000.0
    chirp = np.sin(2 * np.pi * (f0 * t + (f1 - f0) * t * t / (2 * max(seconds, 1e-3))))
    tone = np.sin(2 * np.pi * 440 * t) * (0.5 + 0.5 * np.sin(2 * np.pi * t))
    noise = np.random.default_rng(seed).standard_normal(n)
    return np.clip(0.3 * chirp + 0.15 * tone + 0.02 * noise, -1, 1).astype(np.float32)


def write_wav(path: Path, samples) -> None:
    """A 16 kHz mono PCM 16-bit WAV (standard library's wave module)."""
    import wave

    import numpy as np
    pcm = (np.asarray(samples) * 32767).round().astype("<i2").tobytes()
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(RATE)
        f.writeframes(pcm)


def wav_name(seconds: float) -> str:
    return f"clip-{seconds:g}s.wav"


def clip_for(seconds: float, wav_dir: Path) -> dict:
    """The benchmark's clip of `seconds`: written to wav_dir (kept if there), read back as the app reads a
    WAV; its samples, frames and soft tokens."""
    from pyapp.families.gemma4_audio import features
    from pyapp.families.gemma4_audio.wav import read_wav
    path = wav_dir / wav_name(seconds)
    if not path.exists():
        wav_dir.mkdir(parents=True, exist_ok=True)
        write_wav(path, synthetic_clip(seconds))
    samples = read_wav(path.read_bytes()).samples
    n = len(samples)
    return {"seconds": seconds, "wav": path.name, "samples": n, "frames": features.frames(n),
            "soft_tokens": features.soft_tokens(n), "clip": samples[:features.MAX_SAMPLES]}


def describe(cfg) -> str:
    return (f"{cfg.n_layers} layers x {cfg.hidden}, {cfg.n_heads} heads of {cfg.head_dim}, ffn {cfg.ffn_dim}, "
            f"channels {cfg.channels[0]}/{cfg.channels[1]}, output {cfg.out_dim}, text width {cfg.text_hidden}")


def timed(fn, repeat: int) -> tuple[float, list[float]]:
    """(first, runs): fn's first call, then a warm-up, then `repeat` calls, in seconds."""
    t = time.perf_counter()
    fn()
    first = time.perf_counter() - t
    fn()
    runs = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t)
    return first, runs


def bench_features(clip: dict, repeat: int, label: dict) -> dict:
    from pyapp.families.gemma4_audio import features
    _, runs = timed(lambda: features.log_mel(clip["clip"]), repeat)
    rec = {"kind": "audio_features", **label, **{k: clip[k] for k in ("seconds", "samples", "frames")},
           "python": f"{platform.python_implementation()} {platform.python_version()}",
           "features_ms": ms(statistics.median(runs)), "runs_ms": [ms(r) for r in runs]}
    return rec


def encode_record(enc, clip: dict, first: float, runs: list[float], gpu_ms, label: dict) -> dict:
    encode = ms(statistics.median(runs))
    return {"kind": "audio_encode", **label, **{k: clip[k] for k in ("seconds", "samples", "frames", "soft_tokens")},
            "max_frames": enc.max_frames, "first_ms": ms(first), "encode_ms": encode, "runs_ms": [ms(r) for r in runs],
            "gpu_ms": gpu_ms}


def bench_encode(dev, enc, clip: dict, repeat: int, label: dict) -> dict:
    def once():
        dev.read(enc.encode_clip(clip["clip"]), 0, 4)
    first, runs = timed(once, repeat)
    gpu = gpu_time_ms(dev, enc.plan, repeat + 1)          # the plan's uniforms: this clip's length
    return encode_record(enc, clip, first, runs, gpu, label)


def ttft_prompt(eng, clip: dict) -> tuple[list[int], int]:
    """The prompt's ids (one user message: the clip, then PROMPT_TEXT) and where the clip's soft tokens go."""
    from pyapp.app.audio import audio_token
    from pyapp.chat import render_ids, user_content
    from pyapp.runtime.soft_tokens import placeholder_starts
    n = clip["soft_tokens"]
    ids = render_ids(eng.tokenizer, [{"role": "user", "content": user_content(PROMPT_TEXT, clips=[n])}],
                     add_generation_prompt=True)
    return ids, placeholder_starts(ids, [n], audio_token(eng.tokenizer), "clip")[0]


def ttft_record(eng, clip: dict, ids: list[int], ttft: list[float], split: list[tuple], label: dict) -> dict:
    """ttft: the unsynchronised runs' seconds; split: (total, encode, prefill) of the synchronised runs."""
    n, ttft_ms = clip["soft_tokens"], ms(statistics.median(ttft))
    return {"kind": "audio_ttft", **label, "seconds": clip["seconds"], "soft_tokens": n, "prompt_tokens": len(ids),
            "prompt": f"<user: audio ({n} soft tokens) + {PROMPT_TEXT!r}>",
            "ttft_ms": ttft_ms, "runs_ms": [ms(r) for r in ttft],
            "encode_ms": ms(statistics.median(s[1] for s in split)),
            "prefill_ms": ms(statistics.median(s[2] for s in split)),
            "synced_total_ms": ms(statistics.median(s[0] for s in split)),
            "context_length": eng.context_length, "chunk": eng.runner.chunk}


def bench_ttft(dev, eng, enc, clip: dict, repeat: int, label: dict) -> dict:
    from pyapp.runtime.soft_tokens import SoftRun
    from pyapp.sampling import SamplingParams
    ids, at = ttft_prompt(eng, clip)
    params = SamplingParams(temperature=0.0, max_tokens=1)

    def once(sync: bool, i: int) -> tuple[float, float, float]:
        eng.reset()
        t = time.perf_counter()
        out = enc.encode_clip(clip["clip"])
        if sync:
            dev.read(out, 0, 4)
        t_enc = time.perf_counter() - t
        res = eng.generate(ids, params, stop_ids=(), soft=[SoftRun(at, out, clip["soft_tokens"],
                                                                      f"bench-{clip['seconds']}-{i}")])
        if len(res.tokens) != 1:
            raise SystemExit(f"generated {len(res.tokens)} tokens, expected 1")
        return time.perf_counter() - t, t_enc, res.prefill_s

    once(False, -1)                                 # warm-up: every plan the runs use
    once(True, -2)
    ttft = [once(False, i)[0] for i in range(repeat)]
    split = [once(True, i) for i in range(repeat)]
    return ttft_record(eng, clip, ids, ttft, split, label)


async def measure_async(dev, mmproj: str, text: str | None, wav_dir: str, seconds=(10, 30), repeat: int = 5,
                        context: int = 4096, chunk: int = 2048) -> list[dict]:
    """The same records on the browser path (Pyodide + Dawn: bench/node_bench.mjs --audio), where readbacks
    are awaited and the features are computed by Pyodide. The clips come from wav_dir/clip-Ss.wav (the native
    run's --wav-dir: no numpy here)."""
    from pyapp.families.gemma4_audio.config import AudioConfig
    from pyapp.families.gemma4_audio.encoder import AudioEncoder
    from pyapp.gguf import read_gguf
    from pyapp.runtime.soft_tokens import SoftRun
    g = read_gguf(mmproj)
    label = {"runtime": f"ours-{dev.backend}", "adapter": dev.describe(), "mmproj": os.path.basename(mmproj),
             "encoder": describe(AudioConfig.from_gguf(g))}
    clips = [clip_for(s, Path(wav_dir)) for s in seconds]
    t = time.perf_counter()
    enc = await AudioEncoder.open_async(dev, g)
    label["load_s"] = round(time.perf_counter() - t, 2)
    out = []

    def emit(rec: dict) -> None:
        out.append(rec)
        print(json.dumps(rec), file=sys.stderr, flush=True)

    async def encode_timed(clip) -> tuple[float, object]:
        t = time.perf_counter()
        buf = enc.encode_clip(clip["clip"])
        await dev.read_async(buf, 0, 4)
        return time.perf_counter() - t, buf

    for clip in clips:
        emit(bench_features(clip, repeat, label))
        first, _ = await encode_timed(clip)
        await encode_timed(clip)
        runs = [(await encode_timed(clip))[0] for _ in range(repeat)]
        try:
            gpu = span_ms((await dev.time_plan_gpu_async(enc.plan, repeat=repeat + 1))["ns"])
        except Exception:                           # no timestamp-query feature
            gpu = None
        emit(encode_record(enc, clip, first, runs, gpu, label))
    if not text:
        return out
    eng, label, params = await text_engine_async(dev, text, context, chunk, label)
    for clip in clips:
        ids, at = ttft_prompt(eng, clip)

        async def once(sync: bool, i: int):
            eng.reset()
            t = time.perf_counter()
            buf = enc.encode_clip(clip["clip"])
            if sync:
                await dev.read_async(buf, 0, 4)
            t_enc = time.perf_counter() - t
            res = await eng.generate_async(ids, params, stop_ids=(), soft=[SoftRun(at, buf, clip["soft_tokens"],
                                                                                    f"bench-{clip['seconds']}-{i}")])
            return time.perf_counter() - t, t_enc, res.prefill_s

        await once(False, -1)
        await once(True, -2)
        ttft = [(await once(False, i))[0] for i in range(repeat)]
        split = [await once(True, i) for i in range(repeat)]
        emit(ttft_record(eng, clip, ids, ttft, split, label))
    eng.close()
    return out


def llama_record(ones: list[Path], many: Path, n_clips: int, label: dict) -> dict:
    """llama.cpp's figures for one clip from llama-mtmd-cli logs: `ones` fresh processes with the clip once
    (each one's first encode is its first use of the graph), `many` one with the clip n_clips times in the
    prompt (each encoded apart: <audio|> and <|audio> lie between two clips; mtmd never batches audio).
    A clip longer than 30 s would be several chunks (several encode lines a clip): refused here.

    As bench/vision_bench.py's llama_record reads them: "prompt eval time" runs from the prompt's first
    decode until the first token's logits (the clip's encode and its decode through the text model inside;
    the log-mel features before it, outside). first_encode_ms / ttft_first_ms: the medians over the fresh
    processes; encode_ms: the median encode of clips 2.. of `many` (warm); ttft_ms: the warm estimate,
    ttft_first_ms with the first encode and audio decode replaced by the medians of clips 2..'s."""
    logs = [llama_log(p, "audio") for p in ones]
    b = llama_log(many, "audio")
    rec = {"kind": "audio_llama", **label, "logs": [p.name for p in ones] + [many.name]}
    bad = [p.name for p, a in zip(ones, logs) if len(a["encode_ms"]) != 1 or "prompt_eval_ms" not in a]
    if bad:
        return dict(rec, error=f"{', '.join(bad)}: not one encode line and a prompt eval line (see the log)")
    first = [a["encode_ms"][0] for a in logs]
    first_decode = [a["audio_decode_ms"][0] for a in logs if a["audio_decode_ms"]]
    prompt_eval = [a["prompt_eval_ms"] for a in logs]
    rec.update(soft_tokens=(logs[0]["audio_tokens"] or [None])[0], prompt_tokens=logs[0].get("prompt_eval_n"),
               first_encode_ms=statistics.median(first), first_encode_runs_ms=first,
               first_audio_decode_ms=statistics.median(first_decode) if first_decode else None,
               ttft_first_ms=statistics.median(prompt_eval), ttft_first_runs_ms=prompt_eval,
               load_ms=logs[0].get("load_ms"))
    if len(b["encode_ms"]) != n_clips or n_clips < 2:
        return dict(rec, many_error=f"{many.name}: {len(b['encode_ms'])} encodes for {n_clips} clips (see the log)")
    encode = statistics.median(b["encode_ms"][1:])
    rec.update(encode_ms=encode, encode_runs_ms=b["encode_ms"], audio_decode_runs_ms=b["audio_decode_ms"],
               clips=n_clips)
    if first_decode and len(b["audio_decode_ms"]) == n_clips:
        decode = statistics.median(b["audio_decode_ms"][1:])
        rec.update(audio_decode_ms=decode,
                   ttft_ms=round(rec["ttft_first_ms"] - rec["first_encode_ms"] - rec["first_audio_decode_ms"]
                                 + encode + decode, 2))
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama", nargs="+", type=Path, metavar="ONE_LOG", default=None,
                    help="instead of measuring: llama-mtmd-cli's logs of fresh runs with the clip once (and --many) "
                         "as an audio_llama record")
    ap.add_argument("--many", type=Path, default=None, help="with --llama: the log of the clip --clips times")
    ap.add_argument("--clips", type=int, default=4)
    ap.add_argument("--label", default="{}", help="JSON fields added to the --llama record")
    ap.add_argument("--mmproj", help="the audio projector file (tools/make_audio_bench.py)")
    ap.add_argument("--text", default=None, help="the text model of the same width (tools/make_bench_model.py); "
                    "without it, no time to first token")
    ap.add_argument("--seconds", type=float, nargs="+", default=[10, 30], help="clip lengths (at most 30)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--chunk", type=int, default=2048, help="prefill step (2048, as vision_bench.py: a 30 s clip's 750 soft tokens "
                    "and the prompt around them in one step)")
    ap.add_argument("--wav-dir", type=Path, default=Path("/tmp/audio-bench"),
                    help="where the clips' WAVs are written (clip-SECONDS.wav), for llama-mtmd-cli")
    ap.add_argument("--backend", default="native")
    ap.add_argument("--wav-only", action="store_true", help="only write the WAVs (--wav-dir)")
    args = ap.parse_args()
    if args.llama:
        if args.many is None:
            ap.error("--llama needs --many")
        print(json.dumps(llama_record(args.llama, args.many, args.clips, json.loads(args.label))))
        return 0
    if any(not 0 < s <= 30 for s in args.seconds):
        ap.error("--seconds: each clip 0 to 30 s (Gemma 4 hears 30 s at most)")
    clips = [clip_for(s, args.wav_dir) for s in args.seconds]
    if args.wav_only:
        return 0
    if not args.mmproj:
        ap.error("--mmproj is required")

    from pyapp.families.gemma4_audio.config import AudioConfig
    from pyapp.families.gemma4_audio.encoder import AudioEncoder
    from pyapp.gguf import read_gguf
    from pyapp.gpu import get_device
    g = read_gguf(args.mmproj)
    cfg = AudioConfig.from_gguf(g)
    dev = get_device(args.backend)
    label = {"runtime": f"ours-{dev.backend}", "adapter": dev.describe(), "mmproj": os.path.basename(args.mmproj),
             "encoder": describe(cfg)}
    t = time.perf_counter()
    enc = AudioEncoder.open(dev, g)
    dev.sync()
    label["load_s"] = round(time.perf_counter() - t, 2)
    for clip in clips:
        print(json.dumps(bench_features(clip, args.repeat, label)), flush=True)
        print(json.dumps(bench_encode(dev, enc, clip, args.repeat, label)), flush=True)
    if not args.text:
        return 0
    from pyapp.engine import Engine
    t = time.perf_counter()
    eng = Engine.open(args.text, backend=args.backend, context_length=args.context, chunk=args.chunk, device=dev)
    label = dict(label, text=os.path.basename(args.text), text_load_s=round(time.perf_counter() - t, 2))
    for clip in clips:
        print(json.dumps(bench_ttft(dev, eng, enc, clip, args.repeat, label)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
