"""Image input speed (issue 28): the time to encode one image, and the time to first token of a prompt
with one image, natively (wgpu-native), on a projector file and the text model of the same shape.

    python bench/vision_bench.py --mmproj /tmp/mmproj-bench-e2b.gguf --text /tmp/bench-e2b-Q4_K.gguf \\
        --budgets 280 1120 --repeat 5 --png-dir /tmp/h100/vision

The image: a synthetic square RGB picture (smooth gradients and noise, the same bytes on every run)
made directly at the size transformers' processor resizes a square image to for the budget
(preprocess.target_size: 768 x 768 px = 256 soft tokens at 280, 1584 x 1584 = 1089 at 1120), so that
no resize is timed on either side; --png-dir also writes it as PNG (img-BUDGET.png) for llama.cpp's
llama-mtmd-cli (whose own preprocessing keeps a picture of that size as it is).

Prints one JSON object per line:

  {"kind": "vision_encode", ...}  per budget: an ImageEncoder opened for that budget (as the app opens one),
      `first_ms` the first encode after opening, then `repeat` encodes: `encode_ms` the median wall time
      of ImageEncoder.encode (the RGBA8 pixels uploaded, the plan submitted, the soft tokens copied out)
      until 4 bytes of its output are read back (all GPU work done), `runs_ms` each; `gpu_ms` the
      median GPU time of the encoder's plan alone by timestamp queries (first pass's start to the last
      pass's end), when the device has them
  {"kind": "vision_ttft", ...}  per budget, with the text model loaded: the prompt the chat template makes
      of one user message (the image, then "Describe."), `ttft_ms` the median wall time from the pixels
      (RGBA8 bytes, already at their size) to the first token read back: encode + prefill + the first
      token (greedy), nothing synchronised in between; `encode_ms` and `prefill_ms` the two parts, from
      runs that wait for the encoder's output before generating (prefill_ms: the engine's prefill_s,
      the prompt through the layers and the first token read)

Each measurement: one warm-up, then --repeat runs (median). The KV cache is reset before every run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import sys
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPT_TEXT = "Describe."


def synthetic_rgb(width: int, height: int, seed: int = 0) -> bytes:
    """A photo-like RGB8 picture: smooth colour gradients and ripples plus a little noise."""
    import numpy as np
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    rng = np.random.default_rng(seed)
    r = 128 + 90 * np.sin(x / 53.0) * np.cos(y / 71.0)
    g = 255 * (x + y) / (width + height)
    b = 128 + 100 * np.sin(np.hypot(x - width / 3, y - height / 2) / 29.0)
    img = np.stack([r, g, b], axis=-1) + rng.normal(0, 6, (height, width, 3))
    return np.clip(img, 0, 255).astype(np.uint8).tobytes()


def write_png(path: Path, rgb: bytes, width: int, height: int) -> None:
    """An 8-bit RGB PNG (no filter), standard library only."""
    row = width * 3
    raw = b"".join(b"\x00" + rgb[y * row:(y + 1) * row] for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) \
        + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")
    path.write_bytes(png)


def read_png(path: Path) -> tuple[bytes, int, int]:
    """(rgb, width, height) of a PNG that write_png wrote (8-bit RGB, no filter), standard library only
    (Pyodide has no numpy or Pillow here)."""
    data = path.read_bytes()
    pos, idat, width = 8, [], None
    while pos < len(data):
        n = struct.unpack(">I", data[pos:pos + 4])[0]
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            if (depth, color) != (8, 2):
                raise SystemExit(f"{path}: not an 8-bit RGB PNG")
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + n
    raw, row = zlib.decompress(b"".join(idat)), width * 3 + 1
    if any(raw[y * row] for y in range(height)):
        raise SystemExit(f"{path}: filtered rows (only write_png's unfiltered PNGs are read here)")
    return b"".join(raw[y * row + 1:(y + 1) * row] for y in range(height)), width, height


def image_from_png(path: Path, cfg) -> dict:
    from pyapp.families.gemma4_vision.preprocess import to_rgba
    rgb, w, h = read_png(path)
    across, down = w // cfg.patch, h // cfg.patch
    return {"width": w, "height": h, "across": across, "down": down, "patches": across * down,
            "soft_tokens": across * down // cfg.pool ** 2, "rgba": bytes(to_rgba(rgb, w, h))}


def image_for(budget: int, cfg, png_dir: Path | None) -> dict:
    """The benchmark's square image at `budget`: its size, soft tokens and RGBA8 bytes."""
    from pyapp.families.gemma4_vision.preprocess import target_size, to_rgba
    side = 2048                                  # any square picture: the size is the processor's choice
    w, h = target_size(side, side, budget, cfg.patch, cfg.pool)
    rgb = synthetic_rgb(w, h)
    if png_dir is not None:
        png_dir.mkdir(parents=True, exist_ok=True)
        write_png(png_dir / f"img-{budget}.png", rgb, w, h)
    across, down = w // cfg.patch, h // cfg.patch
    return {"width": w, "height": h, "across": across, "down": down, "patches": across * down,
            "soft_tokens": across * down // cfg.pool ** 2, "rgba": bytes(to_rgba(rgb, w, h))}


def describe(cfg) -> str:
    return (f"{cfg.n_layers} layers x {cfg.hidden}, {cfg.n_heads} heads of {cfg.head_dim}, mlp {cfg.ffn_dim}, "
            f"text width {cfg.text_hidden}")


def ms(seconds: float) -> float:
    return round(seconds * 1e3, 2)


def gpu_time_ms(dev, plan, repeat: int) -> float | None:
    """The median GPU time of a plan by timestamp queries, or None where the device has none."""
    try:
        return span_ms(dev.time_plan_gpu(plan, repeat=repeat)["ns"])
    except Exception:                               # no timestamp-query feature
        return None


def span_ms(ns: list[int]) -> float | None:
    """The median of the (start, end) timestamp pairs' spans, in ms."""
    spans = [(ns[i + 1] - ns[i]) / 1e6 for i in range(0, len(ns) - 1, 2)]
    return round(statistics.median(spans), 3) if spans else None


def encode_timed(dev, enc, image: dict):
    """(seconds, output buffer): one encode, waited for by reading 4 bytes of its output."""
    t = time.perf_counter()
    out = enc.encode(image["rgba"], image["across"], image["down"])
    dev.read(out, 0, 4)
    return time.perf_counter() - t, out


def bench_encode(dev, g, budget: int, image: dict, repeat: int, label: dict) -> tuple[dict, object]:
    from pyapp.families.gemma4_vision.encoder import ImageEncoder
    t = time.perf_counter()
    enc = ImageEncoder.open(dev, g, budget)
    dev.sync()
    load_s = time.perf_counter() - t
    first, _ = encode_timed(dev, enc, image)
    encode_timed(dev, enc, image)                   # warm-up
    runs = [encode_timed(dev, enc, image)[0] for _ in range(repeat)]
    rec = {"kind": "vision_encode", **label, "budget": budget,
           **{k: image[k] for k in ("width", "height", "patches", "soft_tokens")},
           "max_patches": enc.max_patches, "load_s": round(load_s, 2), "first_ms": ms(first),
           "encode_ms": ms(statistics.median(runs)), "runs_ms": [ms(r) for r in runs],
           "gpu_ms": gpu_time_ms(dev, enc.plan, repeat + 1)}
    return rec, enc


def bench_ttft(dev, eng, enc, budget: int, image: dict, repeat: int, label: dict) -> dict:
    from pyapp.app.images import image_token
    from pyapp.chat import render_ids, user_content
    from pyapp.runtime.soft_tokens import SoftRun, placeholder_runs
    from pyapp.sampling import SamplingParams
    n = image["soft_tokens"]
    ids = render_ids(eng.tokenizer, [{"role": "user", "content": user_content(PROMPT_TEXT, [n])}],
                     add_generation_prompt=True)
    runs = placeholder_runs(ids, image_token(eng.tokenizer))
    if len(runs) != 1 or runs[0][1] != n:
        raise SystemExit(f"the prompt's image placeholder runs are {runs}, expected one of {n}")
    at = runs[0][0]
    params = SamplingParams(temperature=0.0, max_tokens=1)

    def once(sync: bool, i: int) -> tuple[float, float, float]:
        eng.reset()
        t = time.perf_counter()
        out = enc.encode(image["rgba"], image["across"], image["down"])
        if sync:
            dev.read(out, 0, 4)
        t_enc = time.perf_counter() - t
        res = eng.generate(ids, params, stop_ids=(), soft=[SoftRun(at, out, n, f"bench-{budget}-{i}")])
        total = time.perf_counter() - t
        if len(res.tokens) != 1:
            raise SystemExit(f"generated {len(res.tokens)} tokens, expected 1")
        return total, t_enc, res.prefill_s

    once(False, -1)                                 # warm-up: every plan the runs use
    once(True, -2)
    ttft = [once(False, i)[0] for i in range(repeat)]
    split = [once(True, i) for i in range(repeat)]
    return {"kind": "vision_ttft", **label, "budget": budget, "soft_tokens": n, "prompt_tokens": len(ids),
            "prompt": f"<user: image ({n} soft tokens) + {PROMPT_TEXT!r}>",
            "ttft_ms": ms(statistics.median(ttft)), "runs_ms": [ms(r) for r in ttft],
            "encode_ms": ms(statistics.median(s[1] for s in split)),
            "prefill_ms": ms(statistics.median(s[2] for s in split)),
            "synced_total_ms": ms(statistics.median(s[0] for s in split)),
            "context_length": eng.context_length, "chunk": eng.runner.chunk}


async def text_engine_async(dev, text: str, context: int, chunk: int, label: dict):
    """(engine, label, params) on the browser path: the text model loaded, the label with its name and load
    time, greedy sampling of one token."""
    from pyapp.engine import Engine
    from pyapp.gguf import read_gguf
    from pyapp.sampling import SamplingParams
    t = time.perf_counter()
    eng = await Engine.open_async(read_gguf(text), dev, context_length=context, chunk=chunk)
    label = dict(label, text=os.path.basename(text), text_load_s=round(time.perf_counter() - t, 2))
    return eng, label, SamplingParams(temperature=0.0, max_tokens=1)


async def measure_async(dev, mmproj: str, text: str | None, png_dir: str, budgets=(280, 1120), repeat: int = 5,
                        context: int = 4096, chunk: int = 2048) -> list[dict]:
    """The same records on the browser path (Pyodide + Dawn: bench/node_bench.mjs --vision), where readbacks
    are awaited. The images come from png_dir/img-BUDGET.png (the native run's --png-dir: no numpy here)."""
    from pyapp.families.gemma4_vision.config import VisionConfig
    from pyapp.families.gemma4_vision.encoder import ImageEncoder
    from pyapp.gguf import read_gguf
    g = read_gguf(mmproj)
    cfg = VisionConfig.from_gguf(g)
    label = {"runtime": f"ours-{dev.backend}", "adapter": dev.describe(), "mmproj": os.path.basename(mmproj),
             "encoder": describe(cfg)}
    images = {b: image_from_png(Path(png_dir) / f"img-{b}.png", cfg) for b in budgets}
    out, encoders = [], {}

    async def encode_timed_async(enc, image):
        t = time.perf_counter()
        buf = enc.encode(image["rgba"], image["across"], image["down"])
        await dev.read_async(buf, 0, 4)
        return time.perf_counter() - t, buf

    for b in budgets:
        image = images[b]
        t = time.perf_counter()
        enc = encoders[b] = await ImageEncoder.open_async(dev, g, b)
        load_s = time.perf_counter() - t
        first, _ = await encode_timed_async(enc, image)
        await encode_timed_async(enc, image)
        runs = [(await encode_timed_async(enc, image))[0] for _ in range(repeat)]
        try:
            gpu = span_ms((await dev.time_plan_gpu_async(enc.plan, repeat=repeat + 1))["ns"])
        except Exception:
            gpu = None
        out.append({"kind": "vision_encode", **label, "budget": b,
                    **{k: image[k] for k in ("width", "height", "patches", "soft_tokens")},
                    "max_patches": enc.max_patches, "load_s": round(load_s, 2), "first_ms": ms(first),
                    "encode_ms": ms(statistics.median(runs)), "runs_ms": [ms(r) for r in runs], "gpu_ms": gpu})
        print(json.dumps(out[-1]), file=sys.stderr, flush=True)
    if not text:
        return out
    from pyapp.app.images import image_token
    from pyapp.chat import render_ids, user_content
    from pyapp.runtime.soft_tokens import SoftRun, placeholder_runs
    eng, label, params = await text_engine_async(dev, text, context, chunk, label)
    for b in budgets:
        image, enc, n = images[b], encoders[b], images[b]["soft_tokens"]
        ids = render_ids(eng.tokenizer, [{"role": "user", "content": user_content(PROMPT_TEXT, [n])}],
                         add_generation_prompt=True)
        at = placeholder_runs(ids, image_token(eng.tokenizer))[0][0]

        async def once(sync: bool, i: int):
            eng.reset()
            t = time.perf_counter()
            buf = enc.encode(image["rgba"], image["across"], image["down"])
            if sync:
                await dev.read_async(buf, 0, 4)
            t_enc = time.perf_counter() - t
            res = await eng.generate_async(ids, params, stop_ids=(), soft=[SoftRun(at, buf, n, f"bench-{b}-{i}")])
            return time.perf_counter() - t, t_enc, res.prefill_s

        await once(False, -1)
        await once(True, -2)
        ttft = [(await once(False, i))[0] for i in range(repeat)]
        split = [await once(True, i) for i in range(repeat)]
        out.append({"kind": "vision_ttft", **label, "budget": b, "soft_tokens": n, "prompt_tokens": len(ids),
                    "prompt": f"<user: image ({n} soft tokens) + {PROMPT_TEXT!r}>",
                    "ttft_ms": ms(statistics.median(ttft)), "runs_ms": [ms(r) for r in ttft],
                    "encode_ms": ms(statistics.median(s[1] for s in split)),
                    "prefill_ms": ms(statistics.median(s[2] for s in split)),
                    "synced_total_ms": ms(statistics.median(s[0] for s in split)),
                    "context_length": eng.context_length, "chunk": eng.runner.chunk})
        print(json.dumps(out[-1]), file=sys.stderr, flush=True)
    eng.close()
    return out


def llama_patterns(media: str = "image") -> dict:
    """llama-mtmd-cli's log lines for each image (media "image") or audio chunk ("audio"): mtmd-cli's
    "mtmd batch encoding done" (or mtmd-helper's "slice encoded"), mtmd-helper's decode lines."""
    return {"encode_ms": rf"(?:mtmd batch encoding done|{media} slice encoded) in (\d+) ms",
            f"{media}_decode_ms": rf"{media} decoded \(batch \d+/\d+\) in (\d+) ms",
            f"{media}_tokens": rf"decoding {media} batch \d+/\d+, n_tokens_batch = (\d+)"}


def llama_log(path: Path, media: str = "image") -> dict:
    """What a llama-mtmd-cli log says: each image's (or audio chunk's) encode and decode times, its tokens,
    the context's perf lines (load, prompt eval: every prompt token's decode, images' included; eval)."""
    import re
    text = path.read_text(errors="replace")
    out = {k: [int(v) for v in re.findall(p, text)] for k, p in llama_patterns(media).items()}
    for name in ("load", "prompt eval", "eval", "total"):
        m = re.search(rf"llama_perf_context_print:\s+{name} time =\s+([\d.]+) ms(?: /\s+(\d+) (?:tokens|runs))?", text)
        if m:
            out[name.replace(" ", "_") + "_ms"] = float(m.group(1))
            if m.group(2):
                out[name.replace(" ", "_") + "_n"] = int(m.group(2))
    return out


def llama_record(one: Path, many: Path, n_images: int, label: dict) -> dict:
    """llama.cpp's figures from two llama-mtmd-cli runs at one budget: `one` a single-turn run with the image
    once (a fresh process: its first encode at a size is its first use of that graph), `many` the same with
    the image n_images times in the prompt (each encoded apart: a text chunk lies between two images).

    llama.cpp's "prompt eval time" runs from the prompt's first decode (the text before the image) until the
    first token's logits are read: the image's encode and its decode through the text model lie inside it
    (mtmd-cli decodes the first text chunk, then encodes the image, then decodes the rest), so it is the
    time to first token less the tokenization and the image's preprocessing (a resize and a conversion
    to floats on the CPU, before the first decode). ttft_first_ms: the single run's prompt eval (the image's
    first encode of the process included); encode_ms: the median encode of images 2.. of `many` (warm);
    ttft_ms: the warm estimate, ttft_first_ms with the first encode and image decode replaced by the medians
    of images 2..'s."""
    a, b = llama_log(one), llama_log(many)
    rec = {"kind": "vision_llama", **label, "logs": [one.name, many.name]}
    if not a["encode_ms"] or "prompt_eval_ms" not in a:
        return dict(rec, error=f"{one.name}: no encode or prompt eval line (see the log)")
    rec.update(soft_tokens=(a["image_tokens"] or [None])[0], first_encode_ms=a["encode_ms"][0],
               first_image_decode_ms=(a["image_decode_ms"] or [None])[0], prompt_tokens=a.get("prompt_eval_n"),
               ttft_first_ms=a["prompt_eval_ms"], load_ms=a.get("load_ms"))
    if len(b["encode_ms"]) != n_images or n_images < 2:
        return dict(rec, many_error=f"{many.name}: {len(b['encode_ms'])} encodes for {n_images} images (see the log)")
    encode = statistics.median(b["encode_ms"][1:])
    rec.update(encode_ms=encode, encode_runs_ms=b["encode_ms"], image_decode_runs_ms=b["image_decode_ms"],
               images=n_images)
    if a["image_decode_ms"] and len(b["image_decode_ms"]) == n_images:
        decode = statistics.median(b["image_decode_ms"][1:])
        rec.update(image_decode_ms=decode, ttft_ms=round(a["prompt_eval_ms"] - a["encode_ms"][0]
                                                         - a["image_decode_ms"][0] + encode + decode, 2))
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama", nargs=2, type=Path, metavar=("ONE_LOG", "MANY_LOG"), default=None,
                    help="instead of measuring: llama-mtmd-cli's two logs (the image once, --images times) as a "
                         "vision_llama record")
    ap.add_argument("--images", type=int, default=4)
    ap.add_argument("--label", default="{}", help="JSON fields added to the --llama record")
    ap.add_argument("--mmproj", help="the projector file (tools/make_vision_bench.py)")
    ap.add_argument("--text", default=None, help="the text model of the same width (tools/make_bench_model.py); "
                    "without it, no time to first token")
    ap.add_argument("--budgets", type=int, nargs="+", default=[280, 1120])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--chunk", type=int, default=2048,
                    help="prefill step (default 2048: a 1120-budget image's 1089 soft tokens in one step, which "
                         "26B-A4B needs: its image tokens see each other both ways)")
    ap.add_argument("--png-dir", type=Path, default=None, help="also write each budget's image as img-BUDGET.png")
    ap.add_argument("--backend", default="native")
    ap.add_argument("--png-only", action="store_true", help="only write the images (--png-dir)")
    args = ap.parse_args()
    if args.llama:
        print(json.dumps(llama_record(*args.llama, args.images, json.loads(args.label))))
        return 0
    if not args.mmproj:
        ap.error("--mmproj is required")

    from pyapp.families.gemma4_vision.config import VisionConfig
    from pyapp.gguf import read_gguf
    from pyapp.gpu import get_device
    g = read_gguf(args.mmproj)
    cfg = VisionConfig.from_gguf(g)
    images = {b: image_for(b, cfg, args.png_dir) for b in args.budgets}
    if args.png_only:
        return 0
    dev = get_device(args.backend)
    label = {"runtime": f"ours-{dev.backend}", "adapter": dev.describe(), "mmproj": os.path.basename(args.mmproj),
             "encoder": describe(cfg)}
    encoders = {}
    for b in args.budgets:
        rec, encoders[b] = bench_encode(dev, g, b, images[b], args.repeat, label)
        print(json.dumps(rec), flush=True)
    if not args.text:
        return 0
    from pyapp.engine import Engine
    t = time.perf_counter()
    eng = Engine.open(args.text, backend=args.backend, context_length=args.context, chunk=args.chunk, device=dev)
    load_s = time.perf_counter() - t
    label = dict(label, text=os.path.basename(args.text), text_load_s=round(load_s, 2))
    for b in args.budgets:
        print(json.dumps(bench_ttft(dev, eng, encoders[b], b, images[b], args.repeat, label)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
