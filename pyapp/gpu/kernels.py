"""Kernel builders: WGSL preludes for quant types and pipeline + dispatch helpers.

Each helper returns what the engine records into a Plan; nothing here touches
a backend directly, so it runs the same in the browser and natively.
"""

from __future__ import annotations

from . import BindGroup, Buffer, Device, Pipeline, Plan

# GGML type id -> (name, elements per block, bytes per block); float types use 4-element pseudo blocks
QUANTS = {
    0: ("f32", 4, 16), 1: ("f16", 4, 8), 30: ("bf16", 4, 8),
    8: ("q8_0", 32, 34), 2: ("q4_0", 32, 18), 3: ("q4_1", 32, 20),
    6: ("q5_0", 32, 22), 7: ("q5_1", 32, 24),
    12: ("q4_k", 256, 144), 13: ("q5_k", 256, 176), 14: ("q6_k", 256, 210),
    39: ("mxfp4", 32, 17),
}
TYPE_IDS = {v[0]: k for k, v in QUANTS.items()}
MAX_GROUPS = 65535


def quant_type(t) -> int:
    """GGML type id from an id, a name ('Q4_K') or an enum with .value."""
    if isinstance(t, str):
        try:
            return TYPE_IDS[t.lower()]
        except KeyError:
            raise ValueError(f"quant type {t} has no GPU kernel (supported: {sorted(TYPE_IDS)})") from None
    t = int(getattr(t, "value", t))
    if t not in QUANTS:
        raise ValueError(f"GGML type {t} has no GPU kernel (supported: {sorted(n for n, _, _ in QUANTS.values())})")
    return t


def quant_prelude(t) -> str:
    name, qk, qb = QUANTS[quant_type(t)]
    return (f"const QK: u32 = {qk}u;\nconst QB: u32 = {qb}u;\n"
            f"fn dq4(bb: u32, i: u32) -> vec4<f32> {{ return dq4_{name}(bb, i); }}\n")


DOT32 = {"q8_0", "q4_k", "q5_k", "q6_k"}   # types with a dedicated dot32 in quants_dot.wgsl


def matvec_prelude(t) -> str:
    """quant_prelude plus matvec's dot32 (32-weight units) for this type."""
    name = QUANTS[quant_type(t)][0]
    impl = f"dot32_{name}" if name in DOT32 else "dot32_generic"
    return quant_prelude(t) + f"fn dot32(rb: u32, u: u32) -> f32 {{ return {impl}(rb, u); }}\n"


def row_bytes(t, k: int) -> int:
    _, qk, qb = QUANTS[quant_type(t)]
    if k % qk:
        raise ValueError(f"row length {k} is not a multiple of the {QUANTS[quant_type(t)][0]} block ({qk})")
    return k // qk * qb


def groups(n: int) -> tuple[int, int]:
    """Workgroup counts (x, y) for n workgroups, within the 65535-per-dimension limit."""
    if n <= MAX_GROUPS:
        return max(n, 1), 1
    y = -(-n // MAX_GROUPS)
    return -(-n // y), y


def matvec(dev: Device, qtype, k: int, n: int, w: Buffer, x: Buffer, y, plan: Plan | None = None,
           tpr: int = 64, wg: int = 256, subgroups: bool | None = None, geglu: bool = False,
           gelu_times: Buffer | tuple | None = None) -> Plan:
    """y[n] = W[n, k] @ x[k] for quantized W (raw GGUF bytes in w).

    geglu: W holds 2n rows (gate then up); y = gelu(gate x) * (up x).
    gelu_times: y = gelu(W x) * gelu_times[:n] (the PLE gate).
    subgroups: use the subgroupAdd variant (default: when the device has the feature).
    """
    row_bytes(qtype, k)
    sg = dev.has_subgroups if subgroups is None else subgroups
    shader, prelude = ("matvec_sg", dev.enables("subgroups")) if sg else ("matvec", "")
    mode = 1 if geglu else 2 if gelu_times is not None else 0
    # 32-weight units pay off once every thread of a row gets several (H100: rows of 4096+)
    units = k % 32 == 0 and k // 32 >= 2 * tpr
    p = dev.pipeline(shader, prelude=prelude + matvec_prelude(qtype),
                     constants={"K": k, "N": n, "TPR": tpr, "WG": wg, "MODE": mode, "UNITS": units})
    bg = dev.bind_group(p, [w, x, y, gelu_times if gelu_times is not None else dev.dummy])
    plan = plan if plan is not None else dev.plan()
    return plan.dispatch(p, bg, *groups(-(-n // (wg // tpr))))


def matmul(dev: Device, qtype, k: int, n: int, w: Buffer, x: Buffer, y, params: Buffer,
           n_tokens: int, plan: Plan | None = None, ldy: int = 0) -> Plan:
    """Y[t, n] = X[t, k] @ W[n, k]^T; params (uniform, u32 x4) must hold t in .x.

    n_tokens sizes the dispatch: the most tokens this plan will see. ldy: row
    stride of Y when W is one row block of a wider matrix (y bound at its column).
    """
    row_bytes(qtype, k)
    p = dev.pipeline("matmul", prelude=quant_prelude(qtype), constants={"K": k, "N": n, "LDY": ldy})
    bg = dev.bind_group(p, [w, x, y, params])
    plan = plan if plan is not None else dev.plan()
    return plan.dispatch(p, bg, -(-n // 64), -(-n_tokens // 64))


def _threads(n: int, wg: int = 64) -> tuple[int, int]:
    return groups(-(-n // wg))


def rms_norm(dev: Device, d: int, x: Buffer, y: Buffer, weight: Buffer | None, step: Buffer,
             max_tokens: int, rows_per_token: int = 1, eps: float = 1e-6, plan: Plan | None = None) -> Plan:
    """y = rms_norm(x) [* weight] over rows of d floats; step.x = tokens."""
    p = dev.pipeline("norm", constants={"D": d, "RPT": rows_per_token, "EPS": eps, "HAS_W": weight is not None})
    bg = dev.bind_group(p, [x, y, weight if weight is not None else dev.dummy, step])
    return (plan or dev.plan()).dispatch(p, bg, *groups(max_tokens * rows_per_token))


def add_normed(dev: Device, d: int, x: Buffer, acc: Buffer, weight: Buffer, step: Buffer, max_tokens: int,
               eps: float = 1e-6, scale: Buffer | None = None, next_out: Buffer | None = None,
               next_weight: Buffer | None = None, plan: Plan | None = None) -> Plan:
    """acc = (acc + rms_norm(x) * weight) [* scale[0]]: a post-norm's residual add (+ layer output scale);
    with next_out: also next_out = rms_norm(acc) * next_weight (the following pre-norm)."""
    nxt = next_out is not None
    p = dev.pipeline("norm", entry="add_normed", constants={"D": d, "EPS": eps, "HAS_SC": scale is not None,
                                                           "HAS_NEXT": nxt})
    res = {0: x, 2: weight, 3: step, 4: acc, 5: scale if scale is not None else dev.dummy}
    if nxt:
        res.update({1: next_out, 8: next_weight})
    else:
        res.update({1: dev.buffer(16, label="unused"), 8: dev.dummy})
    return (plan or dev.plan()).dispatch(p, dev.bind_group(p, res), *groups(max_tokens))


def norm_rope(dev: Device, x: Buffer, y: Buffer, weight: Buffer, step: Buffer, heads: int, head_dim: int,
              rot_dims: int, base: float, max_tokens: int, eps: float = 1e-6, freq_factors: Buffer | None = None,
              plan: Plan | None = None) -> Plan:
    """y = rope(rms_norm(x) * weight) per head of x [T, heads, head_dim] (q/k norm + RoPE in one pass)."""
    p = dev.pipeline("norm", entry="norm_rope", constants={
        "D": head_dim, "RPT": heads, "EPS": eps, "NROT": rot_dims, "BASE": base, "HAS_FF": freq_factors is not None})
    res = {0: x, 1: y, 2: weight, 3: step, 6: freq_factors if freq_factors is not None else dev.dummy}
    return (plan or dev.plan()).dispatch(p, dev.bind_group(p, res), *groups(max_tokens * heads))


def kv_prep(dev: Device, x: Buffer, k_off: int, v_off: int, k_weight: Buffer, kc: Buffer, vc: Buffer,
            step: Buffer, kv_heads: int, head_dim: int, rot_dims: int, base: float, ctx: int, eps: float = 1e-6,
            freq_factors: Buffer | None = None, plan: Plan | None = None) -> Plan:
    """One decode token: kc/vc[h, pos % ctx] = rope(norm(k_h) * k_weight), norm(v_h), where k_h, v_h are
    read from x at float offsets k_off + h*head_dim and v_off + h*head_dim."""
    p = dev.pipeline("norm", entry="kv_prep", constants={
        "D": head_dim, "EPS": eps, "NROT": rot_dims, "BASE": base, "HAS_FF": freq_factors is not None,
        "KOFF": k_off, "VOFF": v_off, "CTX": ctx})
    res = {0: x, 2: k_weight, 3: step, 6: freq_factors if freq_factors is not None else dev.dummy, 9: kc, 10: vc}
    return (plan or dev.plan()).dispatch(p, dev.bind_group(p, res), kv_heads)


def rope(dev: Device, x: Buffer, step: Buffer, heads: int, head_dim: int, rot_dims: int, base: float,
         max_tokens: int, freq_factors: Buffer | None = None, plan: Plan | None = None) -> Plan:
    """NeoX RoPE in place on x [T, heads, head_dim]; positions step.y + t."""
    p = dev.pipeline("rope", constants={"H": heads, "HD": head_dim, "NROT": rot_dims, "BASE": base,
                                        "HAS_FF": freq_factors is not None})
    bg = dev.bind_group(p, [x, freq_factors if freq_factors is not None else dev.dummy, step])
    return (plan or dev.plan()).dispatch(p, bg, *_threads(max_tokens * heads * rot_dims // 2))


def elementwise(dev: Device, op: str, d: int, a: Buffer, step: Buffer, max_tokens: int,
                b: Buffer | None = None, out: Buffer | None = None, cap: float = 30.0,
                scale: float = 1.0, plan: Plan | None = None) -> Plan:
    """op in geglu (out = gelu(a) * b), softcap (a), add / mul (a op= b), scale (a *= scale [* b[0]])."""
    consts = {"D": d}
    res = {0: a, 2: step}
    if op == "softcap":
        consts["CAP"] = cap
    elif op == "scale":
        consts["SCALE"] = scale
        consts["SCALE_BY_B"] = b is not None
        res[1] = b if b is not None else dev.dummy
    else:
        res[1] = b
    if op == "geglu":
        res[3] = out
    p = dev.pipeline("elementwise", entry=op, constants=consts)
    return (plan or dev.plan()).dispatch(p, dev.bind_group(p, res), *_threads(max_tokens * d))


def embed(dev: Device, qtype, d: int, table: Buffer, ids: Buffer, out: Buffer, step: Buffer,
          max_tokens: int, scale: float = 1.0, row0: int = 0, nrows: int = 0xFFFFFFFF,
          plan: Plan | None = None) -> Plan:
    """out[t] = table[ids[t]] * scale for the table rows [row0, row0 + nrows) held by `table`."""
    row_bytes(qtype, d)
    p = dev.pipeline("embed", prelude=quant_prelude(qtype),
                     constants={"D": d, "R0": row0, "RN": nrows, "SCALE": scale})
    bg = dev.bind_group(p, [table, ids, out, step])
    return (plan or dev.plan()).dispatch(p, bg, *_threads(max_tokens * d // 4))


def argmax(dev: Device, v: int, logits: Buffer, out: Buffer, plan: Plan | None = None) -> Plan:
    """out[0] = argmax(logits[:v]) as u32."""
    p = dev.pipeline("sample", entry="argmax", constants={"V": v})
    return (plan or dev.plan()).dispatch(p, dev.bind_group(p, [logits, out]), 1)


def _attn_consts(heads, kv_heads, head_dim, ctx, window=0, scale=1.0):
    if heads % kv_heads or head_dim > 4 * 128:
        raise ValueError(f"attention: {heads} heads over {kv_heads} kv heads, head_dim {head_dim} unsupported")
    return {"H": heads, "HKV": kv_heads, "HD": head_dim, "CTX": ctx, "WINDOW": window, "SCALE": scale}


def kv_store(dev: Device, k: Buffer, v: Buffer, kc: Buffer, vc: Buffer, step: Buffer, kv_heads: int,
             head_dim: int, ctx: int, max_tokens: int, plan: Plan | None = None) -> Plan:
    """Write k, v [T, kv_heads, head_dim] into the caches [kv_heads, ctx, head_dim] at slots (step.y + t) % ctx."""
    p = dev.pipeline("attention", entry="store", constants={"HKV": kv_heads, "HD": head_dim, "CTX": ctx})
    bg = dev.bind_group(p, {1: kc, 2: vc, 4: step, 5: k, 6: v})
    return (plan or dev.plan()).dispatch(p, bg, *_threads(max_tokens * kv_heads * head_dim))


def attention(dev: Device, q: Buffer, kc: Buffer, vc: Buffer, out: Buffer, step: Buffer, heads: int,
              kv_heads: int, head_dim: int, ctx: int, max_tokens: int, window: int = 0, scale: float = 1.0,
              plan: Plan | None = None) -> Plan:
    """out[t, h] = softmax(scale q k^T, causal [+ window]) v for queries at positions step.y + t."""
    c = _attn_consts(heads, kv_heads, head_dim, ctx, window, scale)
    p = dev.pipeline("attention", entry="attend", constants=c)
    bg = dev.bind_group(p, {0: q, 1: kc, 2: vc, 3: out, 4: step})
    return (plan or dev.plan()).dispatch(p, bg, heads, max_tokens)


SAMPLE_SLICE = 4096   # logits per first-stage workgroup (shaders/sample.wgsl SL)


def sample_scratch_bytes(v: int) -> int:
    """Bytes of candidate scratch `sample` needs for a vocabulary of v (0: single stage)."""
    nw = -(-v // SAMPLE_SLICE)
    return 0 if nw <= 1 else nw * 256 * 8 + nw * 4


def sample(dev: Device, v: int, logits: Buffer, out: Buffer, params: Buffer, scratch: Buffer | None = None,
           plan: Plan | None = None) -> Plan:
    """out[0] = token sampled from logits[:v] (modified in place by the repeat penalty).

    params: storage buffer laid out as shaders/sample.wgsl's SampleParams (see pack_sample_params).
    scratch (sample_scratch_bytes(v)): candidates of the first stage; big vocabularies are
    cut into 4096-logit slices whose top k are found in parallel, then merged."""
    plan = plan or dev.plan()
    nw = -(-v // SAMPLE_SLICE)
    if nw <= 1:   # one workgroup does it all; the candidate bindings are declared but unused
        p = dev.pipeline("sample", entry="sample", constants={"V": v})
        unused = {i: dev.buffer(16, label="unused") for i in (4, 5, 6)}
        return plan.dispatch(p, dev.bind_group(p, {1: out, 2: params, 3: logits, **unused}), 1)
    if scratch is None or scratch.size < sample_scratch_bytes(v):
        raise ValueError(f"sampling over {v} logits needs {sample_scratch_bytes(v)} bytes of scratch")
    cv, ci, cnt = (scratch, 0, nw * 1024), (scratch, nw * 1024, nw * 1024), (scratch, nw * 2048, nw * 4)
    consts = {"V": v, "SL": SAMPLE_SLICE, "NW": nw}
    res = {2: params, 3: logits, 4: cv, 5: ci, 6: cnt}
    p = dev.pipeline("sample", entry="topk_local", constants=consts)
    plan.dispatch(p, dev.bind_group(p, res), nw)
    p = dev.pipeline("sample", entry="sample", constants={**consts, "STAGED": True})
    return plan.dispatch(p, dev.bind_group(p, {1: out, **res}), 1)


SAMPLE_PARAMS_BYTES = 32 + 64 * 4
MAX_RECENT = 64


def pack_sample_params(temperature: float, top_k: int, top_p: float, min_p: float, repeat_penalty: float,
                       recent, u: float) -> bytes:
    """Bytes of SampleParams: f32 temperature, top_p, min_p, u, repeat_penalty; u32 top_k, n_recent, pad; u32 recent[64]."""
    import struct
    recent = list(recent)[-MAX_RECENT:]
    head = struct.pack("<5f3I", temperature, top_p, min_p, u, repeat_penalty, max(0, top_k), len(recent), 0)
    return head + struct.pack(f"<{MAX_RECENT}I", *(recent + [0] * (MAX_RECENT - len(recent))))


def moe_route(dev: Device, n_experts: int, k_used: int, logits: Buffer, ids: Buffer, weights: Buffer,
              step: Buffer, max_tokens: int, plan: Plan | None = None) -> Plan:
    """ids/weights [T, k_used] = top-k of softmax(logits [T, n_experts]), renormalized."""
    p = dev.pipeline("moe", entry="route", prelude=quant_prelude(0), constants={"E": n_experts, "KSEL": k_used})
    bg = dev.bind_group(p, {3: step, 4: ids, 5: weights, 6: logits})
    return (plan or dev.plan()).dispatch(p, bg, max_tokens)


def moe_experts(dev: Device, qtype, k: int, n: int, n_experts: int, k_used: int, w: Buffer, x: Buffer,
                y: Buffer, ids: Buffer, step: Buffer, max_tokens: int, per_slot_input: bool = False,
                plan: Plan | None = None, tpr: int = 64, wg: int = 256) -> Plan:
    """y[t*k_used + j] = W[ids[t, j]] [n, k] @ x[t or t*k_used + j] for W [n_experts, n, k]."""
    row_bytes(qtype, k)
    p = dev.pipeline("moe", entry="experts", prelude=quant_prelude(qtype),
                     constants={"E": n_experts, "KSEL": k_used, "K": k, "N": n, "TPR": tpr, "WG": wg,
                                "XPER": k_used if per_slot_input else 1})
    bg = dev.bind_group(p, {0: w, 1: x, 2: y, 3: step, 4: ids})
    return (plan or dev.plan()).dispatch(p, bg, -(-n // (wg // tpr)), max_tokens * k_used)


def moe_geglu(dev: Device, ff: int, k_used: int, gate_up: Buffer, out: Buffer, step: Buffer, max_tokens: int,
              plan: Plan | None = None) -> Plan:
    """out[s, f] = gelu(gate_up[s, f]) * gate_up[s, ff + f] over the T * k_used slots."""
    p = dev.pipeline("moe", entry="geglu_fused", prelude=quant_prelude(0), constants={"KSEL": k_used, "F": ff})
    bg = dev.bind_group(p, {2: out, 3: step, 7: gate_up})
    return (plan or dev.plan()).dispatch(p, bg, *_threads(max_tokens * k_used * ff))


def moe_combine(dev: Device, d: int, k_used: int, expert_out: Buffer, ids: Buffer, weights: Buffer,
                out: Buffer, step: Buffer, max_tokens: int, down_scale: Buffer | None = None,
                plan: Plan | None = None) -> Plan:
    """out[t] = sum_j weights[t, j] * expert_out[t*k_used + j] (* down_scale[ids[t, j]])."""
    p = dev.pipeline("moe", entry="combine", prelude=quant_prelude(0),
                     constants={"KSEL": k_used, "D": d, "HAS_SC": down_scale is not None})
    res = {2: out, 3: step, 4: ids, 5: weights, 8: expert_out, 9: down_scale if down_scale is not None else dev.dummy}
    return (plan or dev.plan()).dispatch(p, dev.bind_group(p, res), *_threads(max_tokens * d))


def ple_combine(dev: Device, n_layers: int, ple_dim: int, max_tokens: int, proj: Buffer, emb: Buffer,
                norm_w: Buffer, out: Buffer, step: Buffer, hidden: int, eps: float,
                plan: Plan | None = None) -> Plan:
    """out [L, max_tokens, ple_dim] = (rms_norm(proj / sqrt(hidden)) * norm_w + emb) / sqrt(2)."""
    p = dev.pipeline("ple", constants={"L": n_layers, "PD": ple_dim, "TMAX": max_tokens,
                                       "PSCALE": hidden ** -0.5, "EPS": eps})
    bg = dev.bind_group(p, [proj, emb, norm_w, out, step])
    return (plan or dev.plan()).dispatch(p, bg, n_layers, max_tokens)


DECODE_KEYS_PER_GROUP = 32   # CH in attention.wgsl


def decode_partials(heads: int, head_dim: int, max_keys: int) -> int:
    """Floats of scratch attention_decode needs."""
    return heads * -(-max_keys // DECODE_KEYS_PER_GROUP) * (head_dim + 2)


def attention_decode(dev: Device, q: Buffer, kc: Buffer, vc: Buffer, out: Buffer, partials: Buffer, step: Buffer,
                     heads: int, kv_heads: int, head_dim: int, ctx: int, max_keys: int, window: int = 0,
                     scale: float = 1.0, plan: Plan | None = None) -> Plan:
    """attention() for one query token, split over the keys: (heads x ceil(max_keys / 32)) workgroups
    of partial softmax states, then one combine per head. max_keys: the most keys a query sees."""
    if head_dim % 4 or head_dim > 512:
        raise ValueError(f"decode attention needs head_dim % 4 == 0 and <= 512, got {head_dim}")
    nsplit = -(-max_keys // DECODE_KEYS_PER_GROUP)
    c = dict(_attn_consts(heads, kv_heads, head_dim, ctx, window, scale), NSPLIT=nsplit)
    plan = plan or dev.plan()
    p = dev.pipeline("attention", entry="attend_split", constants=c)
    plan.dispatch(p, dev.bind_group(p, {0: q, 1: kc, 2: vc, 4: step, 7: partials}), heads, nsplit)
    p = dev.pipeline("attention", entry="attend_combine", constants=c)
    return plan.dispatch(p, dev.bind_group(p, {3: out, 7: partials}), heads)
