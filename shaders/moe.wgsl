// Mixture of experts: router top-k, expert matvecs gathered by expert id, combine.
//
// Mirrors reference.forward ReferenceModel.moe (Ollama's gemma4 TextMoE):
//   route:   probs = softmax(LOG[t, :E]); the KSEL largest (lowest id on ties)
//            -> IDS[t, k]; WTS[t, k] = their probs renormalized to sum 1.
//            One workgroup of RWG threads per token (E <= 32 * RWG, KSEL <= RWG). Dispatch (T).
//   experts: Y[s, n] = sum_k W[IDS[s], n, k] * X[xrow(s), k] for slots s = t*KSEL + j,
//            W raw GGUF bytes of [E, N, K]; xrow = t (XPER = 1, shared input) or s
//            (XPER = KSEL, one input row per slot). Like matvec.wgsl, TPR threads per
//            row. Dispatch (ceil(N / (WG/TPR)), T * KSEL).
//   combine: C[t, d] = sum_j WTS[t, j] * YE[t*KSEL + j, d] * SC[IDS[t*KSEL + j]]
//            (SC: per-expert down scale, 1 when HAS_SC is false). Dispatch ceil(T*D / 64).
// S.n_tokens = T tokens (S: Step, the per-step uniform).

override E: u32 = 1u;
override KSEL: u32 = 1u;
override K: u32 = 4u;
override N: u32 = 1u;
override XPER: u32 = 1u;
override D: u32 = 1u;
override HAS_SC: bool = false;
override TPR: u32 = 64u;
override WG: u32 = 256u;

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> S: Step;
@group(0) @binding(4) var<storage, read_write> IDS: array<u32>;
@group(0) @binding(5) var<storage, read_write> WTS: array<f32>;
@group(0) @binding(6) var<storage, read> LOG: array<f32>;
@group(0) @binding(8) var<storage, read> YE: array<f32>;
@group(0) @binding(9) var<storage, read> SC: array<f32>;

//!include quants

// route: one workgroup of RWG threads per token; thread l owns experts l, l + RWG, ...
// (at most 32 each: a bit mask marks those taken). Max and sum of exp by tree reductions,
// then KSEL rounds of a parallel argmax (ties -> lowest expert id, as the reference's
// stable sort). A single-thread version took ~290 us per layer on an H100 for E = 128.
override RWG: u32 = 128u;
var<workgroup> rv: array<f32, RWG>;
var<workgroup> ri: array<u32, RWG>;
var<workgroup> rp: array<f32, RWG>;
const NONE: u32 = 0xffffffffu;

fn reduce_max(lid: u32, v: f32) -> f32 {
    rv[lid] = v;
    workgroupBarrier();
    for (var s = RWG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) { rv[lid] = max(rv[lid], rv[lid + s]); }
        workgroupBarrier();
    }
    let r = rv[0];
    workgroupBarrier();
    return r;
}

fn reduce_sum(lid: u32, v: f32) -> f32 {
    rv[lid] = v;
    workgroupBarrier();
    for (var s = RWG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) { rv[lid] += rv[lid + s]; }
        workgroupBarrier();
    }
    let r = rv[0];
    workgroupBarrier();
    return r;
}

// (value, id) with the larger value, the lower id on equal values; NONE loses.
fn better(v: f32, i: u32, ov: f32, oi: u32) -> bool {
    return oi != NONE && (i == NONE || ov > v || (ov == v && oi < i));
}

@compute @workgroup_size(RWG)
fn route(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.x;
    if (t >= S.n_tokens) { return; }
    let base = t * E;
    var m = -3.4e38;
    for (var e = lid; e < E; e += RWG) { m = max(m, LOG[base + e]); }
    m = reduce_max(lid, m);
    var part = 0.0;
    for (var e = lid; e < E; e += RWG) { part += exp(LOG[base + e] - m); }
    let total = reduce_sum(lid, part);

    var taken = 0u;
    var chosen_sum = 0.0;
    for (var j = 0u; j < KSEL; j++) {
        var bv = -3.4e38;
        var bi = NONE;
        var k = 0u;
        for (var e = lid; e < E; e += RWG) {
            let v = LOG[base + e];
            if ((taken & (1u << k)) == 0u && better(bv, bi, v, e)) { bv = v; bi = e; }
            k++;
        }
        rv[lid] = bv;
        ri[lid] = bi;
        workgroupBarrier();
        for (var s = RWG / 2u; s > 0u; s >>= 1u) {
            if (lid < s && better(rv[lid], ri[lid], rv[lid + s], ri[lid + s])) {
                rv[lid] = rv[lid + s];
                ri[lid] = ri[lid + s];
            }
            workgroupBarrier();
        }
        let best = ri[0];
        let p = exp(rv[0] - m) / total;
        if (best % RWG == lid) { taken |= 1u << (best / RWG); }
        if (lid == 0u) {
            IDS[t * KSEL + j] = best;
            rp[j] = p;
        }
        chosen_sum += p;
        workgroupBarrier();
    }
    if (lid < KSEL) { WTS[t * KSEL + lid] = rp[lid] / chosen_sum; }
}

var<workgroup> red: array<f32, WG>;

@compute @workgroup_size(WG)
fn experts(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let slot = wid.y;
    if (slot >= S.n_tokens * KSEL) { return; }
    let row = wid.x * (WG / TPR) + lid / TPR;
    let t = lid % TPR;
    let e = IDS[slot];
    let xrow = select(slot / KSEL, slot, XPER > 1u);
    let gpb = QK / 4u;
    let rowbase = (e * N + min(row, N - 1u)) * (K / QK) * QB;
    var acc = 0.0;
    for (var g = t; g < K / 4u; g += TPR) {
        acc += dot(dq4(rowbase + (g / gpb) * QB, g % gpb), X[xrow * (K / 4u) + g]);
    }
    red[lid] = acc;
    workgroupBarrier();
    for (var s = TPR / 2u; s > 0u; s >>= 1u) {
        if (t < s) { red[lid] += red[lid + s]; }
        workgroupBarrier();
    }
    if (t == 0u && row < N) { Y[slot * N + row] = red[lid]; }
}

@compute @workgroup_size(64)
fn combine(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if (i >= S.n_tokens * D) { return; }
    let t = i / D;
    let d = i % D;
    var acc = 0.0;
    for (var j = 0u; j < KSEL; j++) {
        let s = t * KSEL + j;
        var w = WTS[s];
        if (HAS_SC) { w *= SC[IDS[s]]; }
        acc += w * YE[s * D + d];
    }
    Y[i] = acc;
}
