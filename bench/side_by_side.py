"""One markdown table from the side-by-side runs: ours (native, browser path) vs llama.cpp's llama-bench.

    python bench/side_by_side.py RESULTS_DIR_OR_FILES... [--prompt 512 --gen 128 --ttft-prompt 4000]

Reads JSON lines (bench/h100.sh writes them): bench/bench.py records (`"backend": "native"`),
bench/node_bench.mjs records (`"runtime": "pyodide+dawn (node)"`), bench.py --kernels rows
(`"kernel"`) and llama-bench `-o jsonl` (or `-o json`) records (`"n_prompt"`, `"avg_ts"`).
Models are matched by file name. Prefill rows compare ours at --prompt tokens with llama-bench's
pp<prompt>; decode rows ours' decode over --gen tokens with llama-bench's tg<gen>. `bound` is
bench.py's bound_tok_s: weight bytes read per token at the best matvec bandwidth it measured
(--hbm GB/s adds the bound at that bandwidth). Time to first token rows come from records with
--ttft-prompt prompt tokens (ours: prefill time; llama.cpp: prompt / pp tok/s).
DiffusionGemma records (bench.py / node_bench.mjs on a `diffusion-gemma` file: `"mode": "diffusion"`)
get their own table: time per denoising step, steps taken, committed tokens/s and tokens per forward
pass, beside the a26b file's decode tok/s in the same runtime (and budget) when its records are there,
else the figures given with --a26b-decode RUNTIME=TOK_S (RUNTIME: native or browser).
Speculative decoding records (bench/h100.sh speculate, given with --speculation DIR_OR_FILES: kept
apart, since their N = 0 baselines are ordinary records) get a table of their own: decode tok/s per
prompt kind and N beside N = 0's, with drafted, accepted and tokens per step.
Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def load_records(paths: list[str]) -> list[dict]:
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(q for q in p.iterdir() if q.suffix in (".jsonl", ".json"))
        elif p.exists():
            files.append(p)
    out = []
    for f in files:
        text = f.read_text(errors="replace").strip()
        if not text:
            continue
        if text.startswith("["):                      # llama-bench -o json
            try:
                out += [r for r in json.loads(text) if isinstance(r, dict)]
                continue
            except json.JSONDecodeError:
                pass
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    print(f"{f}: skipped a line that is not JSON", file=sys.stderr)
    return out


def kind(r: dict) -> str | None:
    if "kernel" in r:
        return "kernel"
    if r.get("mode") == "diffusion":
        return "diffusion"
    if "avg_ts" in r and "n_prompt" in r:
        return "llama"
    if "decode_tok_s" in r:
        return "browser" if r.get("backend") == "browser" or "runtime" in r else "native"
    return None


def fmt(x, digits: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and x >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def ratio(a, b) -> str:
    return f"{a / b:.2f}" if a and b else "-"


def build(records: list[dict], prompt: int, gen: int, ttft_prompt: int, hbm: float) -> str:
    ours: dict[tuple[str, str, int], dict] = {}      # (runtime, file, prompt_tokens) -> last record
    llama: dict[tuple[str, int, int], dict] = {}     # (file, n_prompt, n_gen) -> last record
    kernels = [r for r in records if kind(r) == "kernel"]
    for r in records:
        k = kind(r)
        if k in ("native", "browser"):
            ours[(k, os.path.basename(r.get("file", "?")), int(r.get("prompt_tokens", 0)))] = r
        elif k == "llama":
            llama[(os.path.basename(r.get("model_filename", "?")), int(r["n_prompt"]), int(r["n_gen"]))] = r
    files = sorted({f for _, f, _ in ours} | {f for f, _, _ in llama})
    lines: list[str] = []

    # where and what
    adapters = sorted({r.get("adapter", "") for r in records if kind(r) in ("native", "browser", "kernel")} - {""})
    gpus = sorted({r.get("gpu_info", "") for r in llama.values()} - {""})
    commits = sorted({f"{r.get('build_commit')} (build {r.get('build_number')}), backends {r.get('backends')}"
                      for r in llama.values()})
    dates = sorted({r.get("test_time", "")[:10] for r in llama.values()} - {""})
    for label, vals in (("ours, adapter", adapters), ("llama.cpp, GPU", gpus), ("llama.cpp build", commits),
                        ("date", dates)):
        if vals:
            lines.append(f"- {label}: {'; '.join(vals)}")
    if kernels:
        best = max(kernels, key=lambda r: r.get("gb_s", 0))
        lines.append(f"- best matvec bandwidth (ours, native): {best.get('gb_s')} GB/s ({best.get('quant')}, "
                     f"subgroups {best.get('subgroups')}); tiny dispatch "
                     f"{next((r['us'] for r in kernels if r.get('kernel') == 'tiny-dispatch'), '-')} us")
    some = next((r for r in ours.values()), None)
    if some:
        lines.append(f"- ours: prefill chunk {some.get('chunk', '-')}, context {some.get('context_length', '-')}; "
                     f"llama.cpp: llama-bench -p {prompt} -n {gen} -ngl 99 (mean of its repetitions)")
    if lines:
        lines.append("")

    hbm_col = f" | bound at {hbm:g} GB/s" if hbm else ""
    lines.append(f"| model (file) | metric | ours, native | ours, browser path | llama.cpp CUDA | native / llama.cpp "
                 f"| browser / llama.cpp | bound tok/s{hbm_col} |")
    lines.append("| --- | --- | --- | --- | --- | --- | --- | ---" + (" | ---" if hbm else "") + " |")
    for f in files:
        nat = ours.get(("native", f, prompt))
        bro = ours.get(("browser", f, prompt))
        pp = llama.get((f, prompt, 0))
        tg = llama.get((f, 0, gen))
        if not (nat or bro or pp or tg):
            continue
        size = next((r.get("file_gib") for r in (nat, bro) if r and r.get("file_gib")), None)
        if size is None and (pp or tg):
            size = round((pp or tg).get("model_size", 0) / 2**30, 2)
        bpt = nat.get("bytes_per_token") if nat else None
        read = (f"{bpt / 1e9:.2f} GB" if bpt >= 1e8 else f"{bpt / 1e6:.1f} MB") if bpt else None
        name = f"{f} ({size} GiB" + (f", {read} read/token)" if read else ")")
        bound = nat.get("bound_tok_s") if nat else None
        hb = f" | {fmt(hbm * 1e9 / bpt)}" if hbm and bpt else (" | -" if hbm else "")
        rows = (("prefill tok/s", "prefill_tok_s", pp, "-"), ("decode tok/s", "decode_tok_s", tg, fmt(bound)))
        for metric, key, ll, b in rows:
            a = nat.get(key) if nat else None
            c = bro.get(key) if bro else None
            d = ll.get("avg_ts") if ll else None
            bcol = b + (hb if key == "decode_tok_s" else (" | -" if hbm else ""))
            lines.append(f"| {name} | {metric} | {fmt(a)} | {fmt(c)} | {fmt(d)} | {ratio(a, d)} | {ratio(c, d)} "
                         f"| {bcol} |")
            name = '"'

    # time to first token
    ttft = []
    for f in files:
        nat = ours.get(("native", f, ttft_prompt))
        bro = ours.get(("browser", f, ttft_prompt))
        pp = llama.get((f, ttft_prompt, 0))
        if not (nat or bro or pp):
            continue
        a = nat.get("prefill_s") if nat else None
        c = bro.get("prefill_s") if bro else None
        d = ttft_prompt / pp["avg_ts"] if pp and pp.get("avg_ts") else None
        ttft.append(f"| {f} | {fmt(a, 2)} | {fmt(c, 2)} | {fmt(d, 2)} | {ratio(d, a)} | {ratio(d, c)} |")
    if ttft:
        head = ("| model (file) | ours, native | ours, browser path | llama.cpp CUDA | llama.cpp / native "
                "| llama.cpp / browser |")
        lines += ["", f"Time to first token, {ttft_prompt}-token prompt (s; ratio = llama.cpp time / ours):", "",
                  head, "| --- | --- | --- | --- | --- | --- |", *ttft]
    return "\n".join(lines) + "\n"


def runtime(r: dict) -> str:
    return "browser" if r.get("backend") == "browser" or "runtime" in r else "native"


def diffusion_table(records: list[dict], a26b_decode: dict) -> str:
    """DiffusionGemma's denoising speed, one row per (file, runtime, budget), beside a26b's decode tok/s."""
    rows: dict[tuple, dict] = {}
    for r in records:
        if kind(r) == "diffusion":
            rows[(os.path.basename(r.get("file", "?")), runtime(r), r.get("budget_mib") or 0)] = r
    if not rows:
        return ""
    decode: dict[tuple, tuple] = {}      # (runtime, budget) -> (tok/s, where from): a26b records first
    for rt, v in a26b_decode.items():
        decode[(rt, 0)] = (v, "given")
    for r in records:
        if kind(r) in ("native", "browser") and "a26b" in os.path.basename(r.get("file", "")) \
                and r.get("decode_tok_s"):
            decode[(kind(r), r.get("budget_mib") or 0)] = (r["decode_tok_s"], "measured")
    some = next(iter(rows.values()))
    lines = ["", f"DiffusionGemma (26B-A4B shape), prompt {some.get('prompt_tokens')} tokens, "
             f"{some.get('max_new_tokens')} new tokens (canvas {some.get('canvas_length')}), the model's sampler "
             f"settings, seed {(some.get('sampler') or {}).get('seed')}; step ms = median over every step; committed tok/s = "
             "committed tokens / (steps + committed blocks' encodes); a26b decode: autoregressive decode of the "
             "same shape in the same runtime and budget.", "",
             "| file | runtime | GPU budget | step ms | steps taken | committed tok/s | tokens / forward "
             "| prompt encode s | a26b decode tok/s | committed / a26b decode | expert hit rate | read MiB / step |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (f, rt, budget), r in sorted(rows.items(), key=lambda kv: (kv[0][0], kv[0][2], kv[0][1])):
        dec, src = decode.get((rt, budget), (None, ""))
        steps = r.get("steps_taken")
        steps = "/".join(map(str, steps)) if isinstance(steps, list) else steps
        lines.append(f"| {f} | {rt} | {f'{budget} MiB' if budget else 'none'} | {fmt(r.get('step_ms'))} | "
                     f"{steps} of {r.get('max_steps')} | {fmt(r.get('committed_tok_s'), 2)} | "
                     f"{fmt(r.get('tokens_per_forward'), 2)} | {fmt(r.get('prompt_encode_s'), 2)} | "
                     f"{fmt(dec)}{' (given)' if src == 'given' else ''} | {ratio(r.get('committed_tok_s'), dec)} | "
                     f"{fmt(r.get('expert_hit_rate'), 3)} | {fmt(r.get('read_mib_per_step'))} |")
    return "\n".join(lines) + "\n"


def speculation_table(records: list[dict]) -> str:
    """Greedy decode with up to N prompt-lookup drafts a step, one row per (file, runtime, prompt kind, N),
    beside the same file, runtime and prompt kind at N = 0."""
    rows: dict[tuple, dict] = {}
    for r in records:
        if "decode_tok_s" in r and "speculate" in r:
            rows[(os.path.basename(r.get("file", "?")), runtime(r), r.get("prompt", "random"),
                  int(r["speculate"]))] = r
    if not rows:
        return ""
    some = next(iter(rows.values()))
    lines = ["", f"Speculative decoding (greedy, prompt lookup), prompt {some.get('prompt_tokens')} tokens "
             f"(repeat: a random block of 16 ids over and over; random: random ids), {some.get('generated_tokens')} "
             "generated; N: the most drafts a step; drafted, accepted, tokens per step: the first timed run's; "
             "step ms: a step alone with its greedy head and readback, one token, and 1 + N tokens in the plan "
             "speculation uses (few-token kernels) and in the prefill plan (64-token tiles); break-even: the "
             "tokens a step of drafts must give to match one-token steps.", "",
             "| file | runtime | prompt | N | decode tok/s | vs N = 0 | drafted | accepted | acceptance "
             "| tokens / step | step ms: 1 token | 1 + N, few-token | 1 + N, tiles | break-even tokens / step |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (f, rt, prompt, n), r in sorted(rows.items()):
        base = rows.get((f, rt, prompt, 0))
        lines.append(f"| {f} | {rt} | {prompt} | {n} | {fmt(r.get('decode_tok_s'))} | "
                     f"{ratio(r.get('decode_tok_s'), base.get('decode_tok_s')) if base else '-'} | "
                     f"{r.get('drafted', '-')} | {r.get('accepted', '-')} | {fmt(r.get('acceptance'), 3)} | "
                     f"{fmt(r.get('tokens_per_step'), 2)} | {fmt(r.get('one_token_step_ms'), 2)} | "
                     f"{fmt(r.get('draft_step_ms'), 2)} | {fmt(r.get('draft_step_tiles_ms'), 2)} | "
                     f"{fmt(r.get('break_even_tokens_per_step'), 2)} |")
    return "\n".join(lines) + "\n"


def parse_decode(items: list[str]) -> dict:
    out = {}
    for item in items:
        rt, _, v = item.partition("=")
        if rt not in ("native", "browser") or not v:
            raise SystemExit(f"--a26b-decode {item!r}: expected native=TOK_S or browser=TOK_S")
        out[rt] = float(v)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", help="result directories or .jsonl/.json files")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--ttft-prompt", type=int, default=4000)
    ap.add_argument("--hbm", type=float, default=0.0, help="GB/s for an extra bound column (e.g. 3350 for H100 SXM)")
    ap.add_argument("--a26b-decode", action="append", default=[], metavar="RUNTIME=TOK_S",
                    help="a26b decode tok/s to show beside DiffusionGemma's where no a26b record is given")
    ap.add_argument("--speculation", action="append", default=[], metavar="DIR_OR_FILE",
                    help="speculative decoding records (bench/h100.sh speculate): their own table (repeatable)")
    args = ap.parse_args()
    records = load_records(args.paths)
    speculation = load_records(args.speculation) if args.speculation else []
    if not records and not speculation:
        print("no records found", file=sys.stderr)
        return 1
    if any(kind(r) in ("native", "browser", "llama", "kernel") for r in records):
        sys.stdout.write(build(records, args.prompt, args.gen, args.ttft_prompt, args.hbm))
    sys.stdout.write(diffusion_table(records, parse_decode(args.a26b_decode)))
    sys.stdout.write(speculation_table(speculation))
    return 0


if __name__ == "__main__":
    sys.exit(main())
