"""Causal attention over the KV cache: the cache store, prefill (tiled, or a token a workgroup) and decode
split over the keys (shaders/attention.wgsl, attention_prefill.wgsl, attention_decode.wgsl)."""

from __future__ import annotations

from dataclasses import dataclass

from .. import Buffer, Device, Plan
from .matvec import CombineInput
from .shared import DECODE_KEYS_PER_GROUP, pipeline, step_counts, thread_groups


def attention_constants(heads, kv_heads, head_dim, ctx, window=0, scale=1.0):
    """The constants every attention shader takes, once the shape is checked (GQA, a head of at most 512)."""
    if heads % kv_heads or head_dim > 4 * 128:
        raise ValueError(f"attention: {heads} heads over {kv_heads} kv heads, head_dim {head_dim} unsupported")
    return {"H": heads, "HKV": kv_heads, "HD": head_dim, "CTX": ctx, "WINDOW": window, "SCALE": scale}


def kv_store(dev: Device, k: Buffer, v: Buffer, kc: Buffer, vc: Buffer, step: Buffer, kv_heads: int,
             head_dim: int, ctx: int, max_tokens: int, plan: Plan | None = None) -> Plan:
    """Write k, v [T, kv_heads, head_dim] into the caches [kv_heads, ctx, head_dim] at slots (pos0 + t) % ctx."""
    p = pipeline(dev, "attention", entry="store", constants={"HKV": kv_heads, "HD": head_dim, "CTX": ctx})
    bg = dev.bind_group(p, {"KC": kc, "VC": vc, "S": step, "Kn": k, "Vn": v})
    return (plan or dev.plan()).dispatch(p, bg, *thread_groups(max_tokens * kv_heads * head_dim))


def attention(dev: Device, q: Buffer, kc: Buffer, vc: Buffer, out: Buffer, step: Buffer, heads: int,
              kv_heads: int, head_dim: int, ctx: int, max_tokens: int, window: int = 0, scale: float = 1.0,
              plan: Plan | None = None, heads_per_group: int | None = None, tiled: bool | None = None,
              tile_rows: int | None = None, all_keys: bool = False, keys_ahead: Buffer | None = None,
              wide: bool | None = None) -> Plan:
    """out[t, h] = softmax(scale q k^T, causal [+ window]) v for queries at positions step.pos0 + t;
    all_keys: every key of the step, not causal (an image encoder's patches attend both ways);
    keys_ahead: u32 [T], query t also sees that many keys after its own (an image's soft tokens see the
    whole image on 26B-A4B's and 31B's sliding layers; the window bounds only the earlier keys).

    tiled (default: where it fits): shaders/attention_prefill.wgsl, tile_rows (default attention_tile_rows)
    query rows a workgroup walking the keys in tiles; else attention.wgsl `attend`, one token a workgroup with heads_per_group (default
    attention_heads_per_group) query heads of one KV head.
    wide (default: heads of 256 and wider where wide_tile_fits): tiled, by attention_prefill_wide.wgsl's
    register-blocked tiles of 32 rows instead."""
    c = attention_constants(heads, kv_heads, head_dim, ctx, window, scale)
    if all_keys:
        c["ALL_KEYS"] = True
    if keys_ahead is not None:
        c["BLOCKS"] = True
    kl = keys_ahead if keys_ahead is not None else dev.dummy
    group = heads // kv_heads
    fits = wide_tile_fits(dev, group, head_dim)
    if wide is None:
        wide = tiled is not False and tile_rows is None and head_dim >= 256 and fits
    if wide:
        if not fits:
            raise ValueError(f"wide attention tiles: no tile for {group} heads a KV head of head_dim {head_dim}")
        p = pipeline(dev, "attention_prefill_wide", constants={**c, "GH": group})
        bg = dev.bind_group(p, {"Q": q, "KC": kc, "VC": vc, "O": out, "S": step, "KL": kl})
        return (plan or dev.plan()).dispatch(p, bg, kv_heads, -(-max_tokens // (WIDE_ROWS // group)))
    rows = tile_rows or attention_tile_rows(dev, group, head_dim)
    if tiled is None:
        tiled = rows > 0
    if tiled:
        if not rows:
            raise ValueError(f"tiled attention: no tile for {group} heads a KV head of head_dim {head_dim}")
        p = pipeline(dev, "attention_prefill", constants={**c, "GH": group, "R": rows})
        bg = dev.bind_group(p, {"Q": q, "KC": kc, "VC": vc, "O": out, "S": step, "KL": kl})
        return (plan or dev.plan()).dispatch(p, bg, kv_heads, -(-max_tokens // (rows // group)))
    gh = heads_per_group or attention_heads_per_group(dev, group, head_dim)
    p = pipeline(dev, "attention", entry="attend", constants={**c, "GH": gh})
    bg = dev.bind_group(p, {"Q": q, "KC": kc, "VC": vc, "O": out, "S": step, "KL": kl})
    return (plan or dev.plan()).dispatch(p, bg, heads // gh, max_tokens)


def attention_tile_rows(dev: Device, group: int, head_dim: int) -> int:
    """Query rows a tiled prefill attention workgroup takes: 32 (head_dim <= 256) or 16 (head_dim <= 512),
    whichever fits the device's workgroup storage (the queries, rows x head_dim floats, stay there); 0
    where none does, or the GQA group does not divide the rows, or head_dim is not a multiple of 4."""
    limit = dev.limits.get("max_compute_workgroup_storage_size", 16384)
    for rows in (32, 16):
        storage = 4 * (rows * head_dim + 8 * 4 * 33 + rows * 33 + 32 * rows + 3 * rows)
        if (rows == 16 or head_dim <= 256) and head_dim <= 512 and head_dim % 4 == 0 and rows % group == 0 \
                and storage <= limit:
            return rows
    return 0


# attention_prefill_wide.wgsl: 32 query rows a workgroup, keys in tiles of 128, Q and K through shared
# memory 8 vec4 at a time (the K chunk's storage then holds the probabilities); its workgroup storage in
# bytes (within the 32 KiB most devices offer)
WIDE_ROWS = 32
WIDE_STORAGE = 4 * (8 * (WIDE_ROWS + 1) * 4 + max(8 * 129 * 4, 128 * WIDE_ROWS) + 33 * WIDE_ROWS + WIDE_ROWS)


def wide_tile_fits(dev: Device, group: int, head_dim: int) -> bool:
    """Whether attention_prefill_wide.wgsl takes this shape: heads of 128-512 dims in 128s (at most a vec4
    a thread of its 128 across the dims), a GQA group dividing its 32 rows, and its ~24 KB of workgroup
    storage on the device."""
    return (head_dim % 128 == 0 and head_dim <= 512 and WIDE_ROWS % group == 0
            and WIDE_STORAGE <= dev.limits.get("max_compute_workgroup_storage_size", 16384))


ATTEND_WG = 128


def attention_heads_per_group(dev: Device, group: int, head_dim: int) -> int:
    """Query heads per prefill attention workgroup: a power of two dividing the GQA group, at most 4
    (each key row is read once for all of them; more would leave too few workgroups for the GPU),
    within the device's workgroup storage (their queries and softmax state)."""
    limit = dev.limits.get("max_compute_workgroup_storage_size", 16384)
    gh = 4
    while gh > 1 and (group % gh or 4 * gh * (head_dim + 2 * ATTEND_WG) > limit):
        gh //= 2
    return gh


def decode_splits(max_keys: int) -> int:
    """attention_decode's splits a head (NSPLIT): DECODE_KEYS_PER_GROUP keys each, max_keys in all."""
    return -(-max_keys // DECODE_KEYS_PER_GROUP)


def decode_split_counts(heads: int, nsplit: int, window: int, keys_before: int, max_tokens: int):
    """rule(n_tokens, pos0) -> attend_split's workgroups (heads, splits, tokens) for a step: the splits its
    last query's keys fill (the most of any of its queries), as the kernel and attend_combine count them."""
    def rule(n_tokens: int, pos0: int) -> tuple[int, int, int]:
        tokens = max(1, min(n_tokens, max_tokens))
        keys = max(0, pos0 + tokens - keys_before)          # key_end of the last query
        if window:
            keys = min(keys, window)
        return heads, min(nsplit, -(-keys // DECODE_KEYS_PER_GROUP)), tokens
    return rule


def decode_partials(heads: int, head_dim: int, max_keys: int) -> int:
    """Floats of scratch attention_decode needs."""
    return heads * decode_splits(max_keys) * (head_dim + 4)    # (m, l, 0, 0) + acc per split


@dataclass
class QueryPrep:
    """What attention_decode's split kernel norms and ropes itself (shaders/attention.wgsl PREP): q holds raw
    projections; mode 1: the query heads at q_off; mode 2: also the KV head's raw k and v at k_off, v_off,
    written into the caches."""
    mode: int
    q_off: int
    q_weight: Buffer
    rope_dims: int
    rope_base: float
    freq_factors: Buffer | None = None
    eps: float = 1e-6
    k_off: int = 0
    v_off: int = 0
    k_weight: Buffer | None = None


# The most partial vec4s (heads x splits x (head_dim / 4 + 1)) a matvec combines into its x in each of its
# workgroups (combine_input) instead of attend_combine's dispatch: E2B's and E4B's sliding layers (8 heads of
# 256 over a 512-key window: 16 splits, 8,320 vec4s, 133 KB a workgroup from L2); a long context's global
# layers (hundreds of splits) keep the combine dispatch.
COMBINE_INPUT_MAX_VEC4 = 8448


def combines_in_matvec(heads: int, head_dim: int, max_keys: int) -> bool:
    """Whether one token's attention output is left to its reader's workgroups to combine (combine_input)."""
    return heads * decode_splits(max_keys) * (head_dim // 4 + 1) <= COMBINE_INPUT_MAX_VEC4


def combine_input(partials: Buffer, step: Buffer, heads: int, head_dim: int, max_keys: int, window: int = 0,
                  keys_before: int = 0) -> CombineInput:
    """The CombineInput of a matvec reading attention_decode(..., combine=False)'s output over max_keys keys."""
    return CombineInput(partials, step, heads, head_dim, decode_splits(max_keys), window, keys_before)


# attend_combine's vec4 of a head's output a workgroup (its 128 threads: 16 slots x 8 parts of the splits)
COMBINE_SLOTS = 16


def attention_decode(dev: Device, q: Buffer, kc: Buffer, vc: Buffer, out: Buffer, partials: Buffer, step: Buffer,
                     heads: int, kv_heads: int, head_dim: int, ctx: int, max_keys: int, window: int = 0,
                     scale: float = 1.0, plan: Plan | None = None, prep: QueryPrep | None = None,
                     max_tokens: int = 1, keys_before: int = 0, combine: bool = True,
                     sized: bool | None = None) -> Plan:
    """attention() for one query token, split over the keys: (heads x ceil(max_keys / DECODE_KEYS_PER_GROUP))
    workgroups of partial softmax states (none written past the query's keys), then the combine: each head's
    output in slices of COMBINE_SLOTS vec4, a workgroup each. max_keys: the most keys a query sees.
    prep: q holds the raw projections, normed and roped (and k, v stored) by the split kernel.
    keys_before = 1: the query sees only the keys before its position (an assistant drafter reading its
    target's cache), the window counted back from there; it stores nothing (prep mode 1 at most).
    max_tokens > 1: a few tokens (speculative decoding's step), each its own query at step.pos0 + t, q
    already normed and roped; partials: decode_partials(...) * max_tokens floats.
    combine=False (one token): the split only; the matvec reading `out` combines the partials into its x
    (combine_input). sized (default: dev.cpu_adapter): only the splits the step's keys fill are dispatched
    (indirect, the counts set by write_step of `step`)."""
    if head_dim % 4 or head_dim > 512:
        raise ValueError(f"decode attention needs head_dim % 4 == 0 and <= 512, got {head_dim}")
    if max_tokens > 1 and prep is not None:
        raise ValueError("decode attention over several tokens takes q normed and roped (no prep)")
    if keys_before not in (0, 1) or (keys_before and prep is not None and prep.mode == 2):
        raise ValueError("keys_before is 0 or 1, and a query that sees only earlier keys stores none")
    nsplit = decode_splits(max_keys)
    c = dict(attention_constants(heads, kv_heads, head_dim, ctx, window, scale), NSPLIT=nsplit, KEYS_BEFORE=keys_before)
    res = {"Q": q, "KC": kc, "VC": vc, "S": step, "PART": partials, "QW": dev.dummy, "KW": dev.dummy, "FF": dev.dummy}
    if prep is not None:
        c.update(PREP=prep.mode, QOFF=prep.q_off, KOFF=prep.k_off, VOFF=prep.v_off, NROT=prep.rope_dims,
                 BASE=prep.rope_base, HAS_FF=prep.freq_factors is not None, EPS=prep.eps)
        res.update(QW=prep.q_weight, KW=prep.k_weight if prep.k_weight is not None else dev.dummy,
                   FF=prep.freq_factors if prep.freq_factors is not None else dev.dummy)
    plan = plan or dev.plan()
    p = pipeline(dev, "attention_decode", entry="attend_split", constants=c)
    indirect = None
    if (dev.cpu_adapter if sized is None else sized) and nsplit > 1:
        key = ("attend_split", heads, nsplit, window, keys_before, max_tokens)
        indirect = step_counts(dev, step).slot(key, decode_split_counts(heads, nsplit, window, keys_before, max_tokens))
    plan.dispatch(p, dev.bind_group(p, res), heads, nsplit, max_tokens, indirect=indirect)
    if not combine:
        if max_tokens != 1:
            raise ValueError("a matvec combines one token's partials (combine=False is for one token)")
        return plan
    p = pipeline(dev, "attention_decode", entry="attend_combine", constants=dict(c, CS=COMBINE_SLOTS))
    groups = -(-(head_dim // 4) // COMBINE_SLOTS)          # workgroups a head, COMBINE_SLOTS vec4 of its output each
    return plan.dispatch(p, dev.bind_group(p, {"O": out, "PART": partials, "S": step}), heads, groups, max_tokens)
