// Greedy sampling on the GPU: OUT[0] = argmax(L[0..V)), lowest index on ties,
// NaN counts as -inf. Mirrors numpy's argmax (the reference sampler at T = 0).
// One workgroup of WG threads: strided scan, then a tree reduction.
// Dispatch: 1 workgroup.

override V: u32;
override WG: u32 = 256u;

@group(0) @binding(0) var<storage, read> L: array<f32>;
@group(0) @binding(1) var<storage, read_write> OUT: array<u32>;

var<workgroup> bv: array<f32, WG>;
var<workgroup> bi: array<u32, WG>;

@compute @workgroup_size(WG)
fn argmax(@builtin(local_invocation_index) lid: u32) {
    var best = -3.4e38;
    var idx = 0xffffffffu;
    for (var i = lid; i < V; i += WG) {
        let v = L[i];
        if (v > best) { best = v; idx = i; }      // strictly greater: first index wins, NaN never
    }
    bv[lid] = best;
    bi[lid] = idx;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            let v = bv[lid + s];
            let j = bi[lid + s];
            if (v > bv[lid] || (v == bv[lid] && j < bi[lid])) { bv[lid] = v; bi[lid] = j; }
        }
        workgroupBarrier();
    }
    if (lid == 0u) { OUT[0] = select(bi[0], 0u, bi[0] == 0xffffffffu); }
}

// ---------------------------------------------------------------------------
// Full sampler: OUT[0] = sampled token id. Mirrors reference.sampling.sample:
// repeat penalty on the recent ids, then greedy (TEMP <= 0) or top-k (k <= 256,
// radix select on the logit bits) -> softmax(l / TEMP) -> top-p -> min-p ->
// pick with the caller's uniform U. Workgroups of 256 threads.
// Two stages for big vocabularies, so the whole GPU scans the logits:
//   topk_local: workgroup w takes the slice [w*SL, (w+1)*SL) of LW, applies the
//               repeat penalty to the recent ids in it, and keeps its own top k
//               (those at or above its k-th largest, at most MAXK) in CV/CI[w*MAXK..],
//               their count in CNT[w]. Dispatch NW = ceil(V / SL).
//   sample:     STAGED: the same top-k over the NW*MAXK candidates, then sort, softmax,
//               top-p, min-p and the pick; else directly over LW (one workgroup does
//               all, penalty included). Dispatch 1.
// The global top k is inside the union of the slices' top k. Ties at the k-th value
// are kept up to MAXK candidates, then ordered by id.
// LW: logits (the penalty writes them in place); SP: the per-token parameters.
// SampleParams, SAMPLE_SLICE and SAMPLE_MAX_K come from the prelude pyapp.gpu.kernels
// generates (it packs the parameters and sizes the candidate scratch with the same values).

override STAGED: bool = false;
override NW: u32 = 1u;               // topk_local workgroups
const SL: u32 = SAMPLE_SLICE;        // logits per topk_local workgroup
const MAXK: u32 = SAMPLE_MAX_K;      // candidates per workgroup: one a thread (workgroups of 256)

@group(0) @binding(3) var<storage, read_write> LW: array<f32>;
@group(0) @binding(2) var<storage, read> SP: SampleParams;
@group(0) @binding(4) var<storage, read_write> CV: array<f32>;
@group(0) @binding(5) var<storage, read_write> CI: array<u32>;
@group(0) @binding(6) var<storage, read_write> CNT: array<u32>;

var<workgroup> hist: array<atomic<u32>, 256>;
var<workgroup> cand_v: array<f32, MAXK>;
var<workgroup> cand_i: array<u32, MAXK>;
var<workgroup> n_cand: atomic<u32>;
var<workgroup> sel: vec2<u32>;          // x: key prefix so far, y: how many still wanted at/below it

// Float -> u32 that sorts the same way (NaN maps to 0, the lowest). NaN is tested on
// the bits: compilers may fold `v != v` away.
fn key_of(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    if ((b & 0x7fffffffu) > 0x7f800000u) { return 0u; }
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

// Does candidate a come before b (larger logit, then lower id)?
fn before(va: f32, ia: u32, vb: f32, ib: u32) -> bool {
    return va > vb || (va == vb && ia < ib);
}

// The inputs one workgroup selects from: input(base, i) for i < count.
// mode 0: logits LW[base + i]; mode 1: candidate slot i (empty slots hold the -3.4e38 pad).
fn input_value(mode: u32, base: u32, i: u32) -> f32 {
    if (mode == 0u) { return LW[base + i]; }
    if (i % MAXK < CNT[i / MAXK]) { return CV[i]; }
    return -3.4e38;
}

fn input_id(mode: u32, base: u32, i: u32) -> u32 {
    return select(CI[i], base + i, mode == 0u);
}

fn effective_k(count: u32) -> u32 {
    var k = select(min(SP.top_k, MAXK), MAXK, SP.top_k == 0u);
    if (SP.temperature <= 0.0) { k = 1u; }
    return min(k, count);
}

// Repeat penalty, once per distinct recent id, on the ids in [lo, hi).
fn penalize(lid: u32, lo: u32, hi: u32) {
    if (SP.repeat_penalty != 1.0 && lid < SP.n_recent) {
        let id = SP.recent[lid];
        var first = id >= lo && id < hi;
        for (var j = 0u; j < lid; j++) { if (SP.recent[j] == id) { first = false; } }
        if (first) {
            let v = LW[id];
            LW[id] = select(v * SP.repeat_penalty, v / SP.repeat_penalty, v > 0.0);
        }
    }
    storageBarrier();
    workgroupBarrier();
}

// k = 1 (greedy): the best input (largest, then lowest id; NaN never) in cand_v/cand_i[0], the
// other slots padded with -inf; returns 1. A strided scan and a tree, no radix rounds.
fn top_1(mode: u32, base: u32, count: u32, lid: u32) -> u32 {
    var bv = -3.4e38;
    var bi = 0xffffffffu;
    for (var i = lid; i < count; i += 256u) {
        let v = input_value(mode, base, i);
        let id = input_id(mode, base, i);
        if (v > bv || (v == bv && id < bi)) { bv = v; bi = id; }
    }
    cand_v[lid] = bv;
    cand_i[lid] = bi;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (lid < s && before(cand_v[lid + s], cand_i[lid + s], cand_v[lid], cand_i[lid])) {
            cand_v[lid] = cand_v[lid + s];
            cand_i[lid] = cand_i[lid + s];
        }
        workgroupBarrier();
    }
    if (lid == 0u && cand_i[0] == 0xffffffffu) { cand_i[0] = base; }   // every input NaN: the first
    workgroupBarrier();
    return 1u;
}

// Radix select, 8 bits a round: leaves in cand_v/cand_i every input at or above the
// k-th largest (at most MAXK; the rest are padded with -inf) and returns how many.
fn top_k(mode: u32, base: u32, count: u32, k: u32, lid: u32) -> u32 {
    if (k == 1u) { return top_1(mode, base, count, lid); }
    if (lid == 0u) { sel = vec2<u32>(0u, k); atomicStore(&n_cand, 0u); }
    for (var round = 0u; round < 4u; round++) {
        let shift = 24u - 8u * round;
        let mask = select(0xffffffffu << (shift + 8u), 0u, round == 0u);
        atomicStore(&hist[lid], 0u);
        workgroupBarrier();
        let prefix = sel.x;
        for (var i = lid; i < count; i += 256u) {
            let key = key_of(input_value(mode, base, i));
            if ((key & mask) == prefix) { atomicAdd(&hist[(key >> shift) & 255u], 1u); }
        }
        workgroupBarrier();
        if (lid == 0u) {
            var want = sel.y;
            var b = 255u;
            loop {
                let c = atomicLoad(&hist[b]);
                if (c >= want || b == 0u) { break; }
                want -= c;
                b -= 1u;
            }
            sel = vec2<u32>(prefix | (b << shift), want);
        }
        workgroupBarrier();
    }
    let thr = sel.x;
    for (var i = lid; i < count; i += 256u) {
        let v = input_value(mode, base, i);
        if (key_of(v) >= thr) {
            let s = atomicAdd(&n_cand, 1u);
            if (s < MAXK) { cand_v[s] = v; cand_i[s] = input_id(mode, base, i); }
        }
    }
    workgroupBarrier();
    let gathered = min(atomicLoad(&n_cand), MAXK);
    if (lid >= gathered) { cand_v[lid] = -3.4e38; cand_i[lid] = 0xffffffffu; }
    workgroupBarrier();
    return gathered;
}

@compute @workgroup_size(256)
fn topk_local(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let lo = wid.x * SL;
    let count = min(SL, V - lo);
    penalize(lid, lo, lo + count);
    let n = top_k(0u, lo, count, effective_k(count), lid);
    CV[wid.x * MAXK + lid] = cand_v[lid];
    CI[wid.x * MAXK + lid] = cand_i[lid];
    if (lid == 0u) { CNT[wid.x] = n; }
}

@compute @workgroup_size(256)
fn sample(@builtin(local_invocation_index) lid: u32) {
    var mode = 0u;
    var count = V;
    if (STAGED) {
        mode = 1u;
        count = NW * MAXK;
    } else {
        penalize(lid, 0u, V);
    }
    let k = effective_k(V);
    let n = min(top_k(mode, 0u, count, k, lid), k);

    // bitonic sort of the 256 slots, best first (one candidate: already first)
    for (var size = 2u; size <= MAXK && k > 1u; size <<= 1u) {
        for (var stride = size >> 1u; stride > 0u; stride >>= 1u) {
            let j = lid ^ stride;
            if (j > lid) {
                let desc = (lid & size) == 0u;
                let a_first = before(cand_v[lid], cand_i[lid], cand_v[j], cand_i[j]);
                if (a_first != desc) {
                    let tv = cand_v[lid]; cand_v[lid] = cand_v[j]; cand_v[j] = tv;
                    let ti = cand_i[lid]; cand_i[lid] = cand_i[j]; cand_i[j] = ti;
                }
            }
            workgroupBarrier();
        }
    }

    // softmax over the k, top-p, min-p, pick (serial: k <= 256)
    if (lid == 0u) {
        if (SP.temperature <= 0.0 || n == 1u) { OUT[0] = cand_i[0]; return; }
        var total = 0.0;
        let top = cand_v[0];
        for (var i = 0u; i < n; i++) {
            let p = exp((cand_v[i] - top) / SP.temperature);
            cand_v[i] = p;
            total += p;
        }
        var keep = n;
        if (SP.top_p < 1.0) {               // 0 keeps only the most likely (Ollama)
            var c = 0.0;
            for (var i = 0u; i < n; i++) {
                c += cand_v[i] / total;
                if (c >= SP.top_p) { keep = i + 1u; break; }
            }
        }
        if (SP.min_p > 0.0) {
            var m = 0u;
            for (var i = 0u; i < n; i++) { if (cand_v[i] / total >= SP.min_p * cand_v[0] / total) { m++; } }
            keep = min(keep, m);
        }
        keep = max(keep, 1u);
        var kept = 0.0;
        for (var i = 0u; i < keep; i++) { kept += cand_v[i]; }
        var c = 0.0;
        var pick = keep - 1u;
        for (var i = 0u; i < keep; i++) {
            c += cand_v[i] / kept;
            if (c > SP.u) { pick = i; break; }
        }
        OUT[0] = cand_i[pick];
    }
}
