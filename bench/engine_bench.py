"""An open engine's speed, through its public API: what bench/bench.py, bench/node_bench.mjs and
`python -m pyapp bench` print.

    from engine_bench import bench, bench_async          # (bench/ on sys.path)
    record = bench(eng, prompt_tokens=256, gen_tokens=64)          # natively
    record = await bench_async(eng, prompt_tokens=256, gen_tokens=64)   # the browser path (Pyodide + Dawn)

A next-token model (pyapp.engine.Engine) is measured by generating: prefill and decode tokens/s on
random token ids, a warm-up over the same prompt (every plan the runs use), then `repeat` runs;
medians, and every run's. With `speculate`, also what a step costs alone. A DiffusionGemma model is
measured by denoising. Each is written once as steps (pyapp.steps) of the engine's public steps
(`generation`, `timed_step`, `denoising`), driven by eng.drive or eng.drive_async.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pyapp.engine import EngineError, SamplingParams  # noqa: E402

PROMPTS = ("random", "repeat")
REPEAT_BLOCK = 16          # tokens of the block a "repeat" prompt repeats


def bench(eng, **options) -> dict:
    """The engine's benchmark record, natively (options: generation's or denoising's below)."""
    return eng.drive(steps(eng, **options))


async def bench_async(eng, **options) -> dict:
    """The same in the browser, where readbacks are awaited."""
    return await eng.drive_async(steps(eng, **options))


def steps(eng, prompt_tokens: int | None = None, gen_tokens: int | None = None, **options):
    """Steps of the benchmark this engine's family takes: denoising for a model that writes by denoising
    (an engine with `denoising`), else generation. Unset sizes: that benchmark's defaults."""
    sizes = {k: v for k, v in (("prompt_tokens", prompt_tokens), ("gen_tokens", gen_tokens)) if v is not None}
    if hasattr(eng, "denoising"):
        return denoising(eng, **sizes, **{k: v for k, v in options.items() if k in ("seed", "repeat", "steps")})
    return generation(eng, **sizes, **options)


def generation(eng, prompt_tokens: int = 256, gen_tokens: int = 64, seed: int = 0, repeat: int = 3,
               temperature: float = 0.0, speculate: int = 0, prompt: str = "random"):
    """Steps: prefill and decode speed on random tokens (greedy unless temperature > 0, no early
    stop): a warm-up over the same prompt (every plan the runs use), then `repeat` runs; medians,
    and every run's. (Greedy decoding of random weights repeats itself, and so does its expert
    routing: temperature 1 gives the varied tokens that measure an expert cache fairly.)
    speculate: drafts per step (greedy only), reported with what was drafted and accepted;
    prompt: "random" ids, or "repeat": a random block of REPEAT_BLOCK ids over and over (text
    that repeats: what prompt lookup drafts from)."""
    if prompt not in PROMPTS:
        raise EngineError(f"benchmark prompt must be one of {', '.join(PROMPTS)}, not {prompt!r}")
    rng = random.Random(seed)
    n = min(prompt_tokens, eng.context_length // 2)
    block = REPEAT_BLOCK if prompt == "repeat" else n
    ids = [rng.randrange(4, eng.config.vocab_size) for _ in range(min(block, n))]
    ids = (ids * -(-n // max(len(ids), 1)))[:n]
    runs = []
    for i in range(repeat + 1):
        eng.reset()
        warm_up = min(gen_tokens, 16) if speculate else 2     # speculating: some steps of drafts too
        params = SamplingParams(temperature=temperature, seed=seed + i, max_tokens=gen_tokens if i else warm_up,
                                speculate=speculate)
        res = yield from eng.generation(ids, params, stop_ids=())
        if i:
            runs.append(res)
    first = runs[0]
    speculated = speculate if params.speculates else 0
    return {"adapter": eng.dev.describe(), "backend": eng.dev.backend, "prompt_tokens": len(ids),
            "prompt": prompt,
            "prefill_s": statistics.median(r.prefill_s for r in runs),
            "prefill_tok_s": statistics.median(r.prefill_tps for r in runs),
            "generated_tokens": len(first.tokens),
            "decode_s": statistics.median(r.decode_s for r in runs),
            "decode_tok_s": statistics.median(r.decode_tps for r in runs),
            "runs": {"prefill_tok_s": [round(r.prefill_tps, 1) for r in runs],
                     "decode_tok_s": [round(r.decode_tps, 1) for r in runs]},
            "context_length": eng.context_length, "model": eng.config.describe(), "temperature": temperature,
            "speculate": speculated,
            # the first run's (greedy runs draft alike): steps after the prompt's, tokens each gave
            "decode_steps": first.decode_steps, "tokens_per_step": round(first.tokens_per_step, 3),
            # a step's wall time as generation paces it (drafts, the checking step, the readbacks as they overlap)
            "ms_per_step": round(1000 * statistics.median(r.decode_s / max(r.decode_steps, 1) for r in runs), 3),
            "drafted": first.drafted, "accepted": first.accepted,
            "acceptance": round(first.accepted / first.drafted, 3) if first.drafted else None,
            **(yield from step_costs(eng, speculated)),
            **memory(eng, runs)}


def step_costs(eng, speculate: int, repeat: int = 5):
    """Steps: with speculation, what a step costs alone (no decode ahead to hide the readback), each
    with its greedy head and the readback of its ids, medians of `repeat` in ms: a one-token step,
    and a step of a token and `speculate` drafts (as many as fit one step) in the plan speculation
    uses (kernels for a few tokens) and in the prefill plan (64-token tiles), for comparison. A
    step of drafts pays off when it gives more tokens than its time over the one-token step's
    (roughly: plain decoding also hides its readbacks behind the next step)."""
    if not speculate:
        return {}
    n = min(1 + speculate, eng.runner.head_rows)
    drafting = yield from drafter_costs(eng, n - 1, repeat)
    runs = {"one": (1, False), "few": (n, True), "tiles": (n, False)}
    times = {k: [] for k in runs}
    for _ in range(repeat):
        for key, (k, few) in runs.items():
            pos = min(len(eng.cached), eng.context_length - n)
            ids = eng.cached[-k:] if len(eng.cached) >= k else [0] * k
            times[key].append((yield from eng.timed_step(ids, pos, few)))
    eng.reset()                  # those steps wrote K/V past the cached tokens
    ms = {k: 1000 * statistics.median(v) for k, v in times.items()}
    break_even = (ms["few"] + drafting.get("drafter_round_ms", 0.0)) / ms["one"]
    return {"one_token_step_ms": round(ms["one"], 3), "draft_step_tokens": n,
            "draft_step_ms": round(ms["few"], 3), "draft_step_tiles_ms": round(ms["tiles"], 3),
            **drafting, "break_even_tokens_per_step": round(break_even, 2),
            "break_even_acceptance": round(acceptance_for(break_even, n - 1), 3)}


def drafter_costs(eng, n: int, repeat: int):
    """Steps: with an assistant drafter on the GPU (eng.drafter a GpuDrafts), a round of n drafts after the
    last cached token, submit to readback, median of `repeat` in ms, and its share per draft."""
    from pyapp.families.gemma4_assistant.source import GpuDrafts
    source = eng.drafter
    if not isinstance(source, GpuDrafts) or len(eng.cached) < 2:
        return {}
    drafter = source.drafter
    # rounds over every run so far, by who drafted them (the drafter, or prompt lookup where the text repeated)
    rounds = {"drafter_rounds": len(source.drafts_made), "lookup_rounds": source.lookup_rounds}
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        yield from drafter.draft(eng.cached[-1], len(eng.cached) - 1, None, n)
        times.append(time.perf_counter() - t0)
    ms = 1000 * statistics.median(times)
    return {**rounds, "drafter_round_ms": round(ms, 3), "drafter_ms_per_draft": round(ms / n, 3)}


def acceptance_for(tokens_per_step: float, n: int) -> float:
    """The chance a draft is accepted (each alike, until the first rejected) at which a step of n drafts gives
    tokens_per_step tokens on average: 1 + a + ... + a^n = tokens_per_step (1.0 when even all do not)."""
    if tokens_per_step >= n + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(50):
        a = (lo + hi) / 2
        if sum(a ** i for i in range(n + 1)) < tokens_per_step:
            lo = a
        else:
            hi = a
    return (lo + hi) / 2


def memory(eng, runs: list) -> dict:
    """The memory plan, and with streamed experts what decoding read: hit rate, bytes per token."""
    plan = eng.memory_plan
    out = {"gpu_memory_mib": round(plan.total / 2**20), "budget_mib": plan.budget and round(plan.budget / 2**20)}
    if not plan.streams:
        return out
    decoded = [r.expert_counts[-1].since(r.expert_counts[1]) for r in runs]   # from the first token to the end
    hits, misses, read, wait_s, copy_s = (sum(field) for field in zip(*decoded))
    tokens = max(sum(len(r.tokens) - 1 for r in runs), 1)
    return {**out, "expert_slots": plan.slots, "expert_cache_mib": round(plan.expert_cache / 2**20),
            "decode_expert_hit_rate": round(hits / max(hits + misses, 1), 3),
            "decode_read_mib_per_token": round(read / tokens / 2**20, 1),
            # a token's wall time spent waiting for the routers' choices, and copying the missed experts
            "decode_router_wait_ms_per_token": round(wait_s / tokens * 1e3, 2),
            "decode_copy_ms_per_token": round(copy_s / tokens * 1e3, 2),
            "planned_read_mib_per_token": round(plan.read_per_token / 2**20, 1),
            "load_read_gb_s": round(eng.load_bytes_per_s / 1e9, 2)}


def denoising(eng, prompt_tokens: int = 128, gen_tokens: int = 256, seed: int = 0, repeat: int = 3,
              steps: int | None = None):
    """Steps: denoising speed on a random prompt with the model's sampler settings (steps: at most this
    many per block instead of its max_denoising_steps; gen_tokens: max new tokens, whole canvases). A
    2-step warm-up (every plan the runs use), then `repeat` seeded runs; medians, and every run's. Random
    weights rarely pass the confidence stop, so steps_taken says how many steps each block took."""
    rng = random.Random(seed)
    C = eng.canvas_length
    room = eng.context_length - C
    ids = [rng.randrange(4, eng.config.vocab_size) for _ in range(max(1, min(prompt_tokens, room)))]
    params = eng.denoise_params(seed=seed, steps=steps, max_new_tokens=min(gen_tokens, room + C - len(ids)))
    runs = []
    eng.reset()
    yield from eng.denoising(ids, replace(params, steps=min(2, params.steps), max_new_tokens=1))
    counts0 = eng.expert_counts()
    for i in range(repeat):
        eng.reset()
        runs.append((yield from eng.denoising(ids, replace(params, seed=seed + i), timed=True)))
    step_s = [t for r in runs for t in r.step_seconds]
    encode_s = [r.encode_seconds[0] for r in runs]
    gen_s = [r.seconds - r.encode_seconds[0] for r in runs]     # the steps and the committed blocks' encodes
    committed = [sum(t != params.pad_id for t in r.tokens) for r in runs]
    out = {"adapter": eng.dev.describe(), "backend": eng.dev.backend, "model": eng.config.describe(),
           "mode": "diffusion", "prompt_tokens": len(ids), "canvas_length": C,
           "max_new_tokens": params.max_new_tokens, "max_steps": params.steps,
           "sampler": {"t_min": round(params.t_min, 6), "t_max": round(params.t_max, 6),
                       "entropy_bound": round(params.entropy_bound, 6),
                       "stability_threshold": params.stability_threshold,
                       "confidence_threshold": round(params.confidence_threshold, 6), "seed": seed},
           "step_ms": round(statistics.median(step_s) * 1e3, 2),
           "committed_tokens": committed[0],
           "committed_tok_s": round(statistics.median(n / t for n, t in zip(committed, gen_s) if t > 0), 2),
           "tokens_per_forward": round(statistics.median(r.tokens_per_forward(params.pad_id) for r in runs), 3),
           "steps_taken": runs[0].steps, "stop_reason": runs[0].stop_reason,
           "prompt_encode_s": round(statistics.median(encode_s), 4),
           "prefill_tok_s": round(len(ids) / statistics.median(encode_s), 1),
           "generate_s": round(statistics.median(gen_s), 3),
           "runs": {"step_ms": [round(statistics.median(r.step_seconds) * 1e3, 2) for r in runs],
                    "committed_tok_s": [round(n / t, 2) for n, t in zip(committed, gen_s) if t > 0],
                    "steps_taken": [r.steps for r in runs]},
           "context_length": eng.context_length}
    plan = eng.memory_plan
    out.update(gpu_memory_mib=round(plan.total / 2**20), budget_mib=plan.budget and round(plan.budget / 2**20))
    if counts0 is not None:
        hits, misses, read, _, _ = eng.expert_counts().since(counts0)
        out.update(expert_slots=plan.slots, expert_cache_mib=round(plan.expert_cache / 2**20),
                   expert_hit_rate=round(hits / max(hits + misses, 1), 3),
                   read_mib_per_step=round(read / max(len(step_s), 1) / 2**20, 1),
                   load_read_gb_s=round(eng.load_bytes_per_s / 1e9, 2))
    return out
