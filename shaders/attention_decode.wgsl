// Decode attention, split over the keys: one query token, or a few (speculative decoding's token
// and drafts, each its own query at S.pos0 + t; PREP == 0 then). Mirrors reference.forward
// attention for those rows: softmax(SCALE * q k^T + mask) v over keys j <= pos (and pos - j <
// WINDOW when WINDOW > 0); query head h reads KV head h / (H / HKV). KEYS_BEFORE = 1 (an assistant
// drafter's query, which reads the target's cache): the keys end before the query's own position,
// j <= pos - 1, the window then counted back from pos - 1.
//
// Q: f32 [T, H, HD] (or raw projections, PREP). KC, VC: f32 [HKV, CTX, HD], position j in slot
// j % CTX. Read as vec4 (HD % 4 == 0, HD <= 512).
//   attend_split:   workgroup (h, s, t) covers keys [lo + s*CH, lo + (s+1)*CH) of token t's range
//                   [lo, pos] and writes its partial softmax state PART[t, h, s] = (m, l, 0, 0,
//                   acc[HD]); a split past the range writes nothing (a plan sized for the context
//                   has many such early on). Dispatch (H, NSPLIT, T), NSPLIT * CH >= the most keys
//                   a query sees.
//   attend_combine: O[t, h] = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s over the splits that
//                   held keys, CS vec4 of O[t, h] a workgroup. Dispatch (H, ceil(HD / 4 / CS), T).
// Both are bound by memory latency, not bandwidth (a decode step reads ~1 MB per layer): every
// loop over keys or splits keeps four independent vec4 loads in flight, and no thread walks a
// serial chain of global loads (a chain of 32 costs ~10 us on an H100).

//!include attention_shape
override WINDOW: u32 = 0u;
override NSPLIT: u32 = 1u;
override KEYS_BEFORE: u32 = 0u;

const WG: u32 = 128u;
const CH: u32 = DECODE_KEYS_PER_GROUP;     // keys per attend_split workgroup (4 threads a key)

@group(0) @binding(0) var<storage, read> Q: array<f32>;
@group(0) @binding(1) var<storage, read_write> KC: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> VC: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> O: array<vec4<f32>>;
@group(0) @binding(4) var<uniform> S: Step;
@group(0) @binding(7) var<storage, read_write> PART: array<vec4<f32>>;
@group(0) @binding(8) var<storage, read> QW: array<f32>;
@group(0) @binding(9) var<storage, read> KW: array<f32>;
@group(0) @binding(10) var<storage, read> FF: array<f32>;

//!include sincos
//!include workgroup_sum

// attend_split's PREP (saves the separate norm/RoPE dispatch of a decode step):
//   0: Q holds the query, normed and roped;
//   1: Q holds the raw projections: head h's query at QOFF + h*HD is normed (weight QW), roped
//      and scaled here;
//   2: as 1, and the raw key and value of KV head kvh at KOFF / VOFF + kvh*HD are normed (K with
//      weight KW, V unweighted), K roped, and written into the caches at slot pos % CTX by the
//      workgroups whose split holds the current position (several query heads of a KV head write
//      the same values), before they read it.
// RoPE as norm.wgsl's roped(): NeoX pairs (i, i + NROT/2), theta = pos * BASE^(-2i/NROT) / FF[i].
override PREP: u32 = 0u;
override QOFF: u32 = 0u;
override KOFF: u32 = 0u;
override VOFF: u32 = 0u;
override NROT: u32 = 0u;
override BASE: f32 = 10000.0;
override HAS_FF: bool = false;
override EPS: f32 = 1e-6;

const HD4_MAX: u32 = 128u;                  // vec4s of the largest head (512 dims)
var<workgroup> qd: array<vec4<f32>, HD4_MAX>;   // the query (HD / 4 used)
var<workgroup> sc: array<f32, CH>;
var<workgroup> part4: array<f32, WG>;
var<workgroup> red4: array<vec4<f32>, WG>;

fn hd4() -> u32 { return HD / 4u; }

// 1 / rms of the HD raw floats of Q at base.
fn inv_rms_q(base: u32, lid: u32) -> f32 {
    var ss = 0.0;
    for (var d = lid; d < HD; d += WG) { ss += Q[base + d] * Q[base + d]; }
    return inverseSqrt(workgroup_sum(lid, ss) / f32(HD) + EPS);
}

// Dim i of rope(norm(Q[base..base+HD]) * w) at position pos; w = KW when is_k, else QW.
fn prep_dim(base: u32, i: u32, inv: f32, pos: f32, is_k: bool) -> f32 {
    let half = NROT / 2u;
    if (i >= NROT) { return Q[base + i] * inv * select(QW[i], KW[i], is_k); }
    let j = i % half;
    var inv_freq = pow(BASE, -2.0 * f32(j) / f32(NROT));
    if (HAS_FF) { inv_freq /= FF[j]; }
    let a = pos * inv_freq;
    let x0 = Q[base + j] * inv * select(QW[j], KW[j], is_k);
    let x1 = Q[base + j + half] * inv * select(QW[j + half], KW[j + half], is_k);
    let sc = sin_cos(a);
    return select(x1 * sc.y + x0 * sc.x, x0 * sc.y - x1 * sc.x, i < half);
}

fn prep_vec4(base: u32, d4: u32, inv: f32, pos: f32, is_k: bool) -> vec4<f32> {
    let i = 4u * d4;
    return vec4<f32>(prep_dim(base, i, inv, pos, is_k), prep_dim(base, i + 1u, inv, pos, is_k),
                     prep_dim(base, i + 2u, inv, pos, is_k), prep_dim(base, i + 3u, inv, pos, is_k));
}

// The keys a query at pos sees: [query_range(pos), key_end(pos)).
fn key_end(pos: u32) -> u32 { return pos + 1u - KEYS_BEFORE; }

fn query_range(pos: u32) -> u32 {
    let end = key_end(pos);
    if (WINDOW > 0u && end > WINDOW) { return end - WINDOW; }
    return 0u;
}

// Split rows over threads for a sum of vec4s: thread lid takes vec4 slot lid % HD4 and the items
// part, part + parts, ... (part = lid / HD4, parts = WG / HD4; threads past parts * HD4 idle).
fn parts() -> u32 { return WG / hd4(); }

// red4[lid] holds each thread's vec4 share of slot lid % slots (part lid / slots); the sum over the
// WG / slots parts of each slot (call in uniform control flow; meaningful for threads lid < slots).
fn sum_parts(lid: u32, v: vec4<f32>, slots: u32) -> vec4<f32> {
    workgroupBarrier();
    red4[lid] = v;
    workgroupBarrier();
    var total = vec4<f32>(0.0);
    if (lid < slots) {
        for (var p = 0u; p < WG / slots; p++) { total += red4[p * slots + lid]; }
    }
    return total;
}

@compute @workgroup_size(WG)
fn attend_split(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let s = wid.y;
    let t = wid.z;
    if (t >= S.n_tokens) { return; }         // uniform per workgroup
    let pos = S.pos0 + t;
    let kvh = h / (H / HKV);
    let lo = query_range(pos);
    let end = key_end(pos);
    let k0 = lo + s * CH;
    let stride = hd4() + 1u;                 // vec4s per partial: (m, l, 0, 0), acc
    let pbase = ((t * H + h) * NSPLIT + s) * stride;
    if (k0 >= end) { return; }               // past the last key: attend_combine reads only the splits before
    let n = min(CH, end - k0);
    if (PREP == 0u) {
        for (var d = lid; d < hd4(); d += WG) {
            let b = (t * H + h) * HD + 4u * d;
            qd[d] = vec4<f32>(Q[b], Q[b + 1u], Q[b + 2u], Q[b + 3u]) * SCALE;
        }
    } else {
        let qb = QOFF + h * HD;
        let inv_q = inv_rms_q(qb, lid);
        for (var d = lid; d < hd4(); d += WG) { qd[d] = prep_vec4(qb, d, inv_q, f32(pos), false) * SCALE; }
    }
    if (PREP == 2u && pos < k0 + CH) {       // this split holds the current position: its K, V into the caches
        let kb = KOFF + kvh * HD;
        let vb = VOFF + kvh * HD;
        let inv_k = inv_rms_q(kb, lid);
        let inv_v = inv_rms_q(vb, lid);
        let dst = (kvh * CTX + pos % CTX) * hd4();
        for (var d = lid; d < hd4(); d += WG) {
            KC[dst + d] = prep_vec4(kb, d, inv_k, f32(pos), true);
            VC[dst + d] = vec4<f32>(Q[vb + 4u * d], Q[vb + 4u * d + 1u], Q[vb + 4u * d + 2u], Q[vb + 4u * d + 3u]) * inv_v;
        }
        storageBarrier();
    }
    workgroupBarrier();

    // scores: key j = lid / 4; its 4 threads take interleaved vec4s of its dims (the four read
    // 64 contiguous bytes at a time), four loads in flight per thread
    let j = lid / 4u;
    let quarter = lid % 4u;
    var a = vec4<f32>(0.0);
    if (j < n) {
        let kb = (kvh * CTX + (k0 + j) % CTX) * hd4();
        var d = quarter;
        for (; d + 12u < hd4(); d += 16u) {
            let k0v = KC[kb + d];
            let k1v = KC[kb + d + 4u];
            let k2v = KC[kb + d + 8u];
            let k3v = KC[kb + d + 12u];
            a += vec4<f32>(dot(qd[d], k0v), dot(qd[d + 4u], k1v), dot(qd[d + 8u], k2v), dot(qd[d + 12u], k3v));
        }
        for (; d < hd4(); d += 4u) { a.x += dot(qd[d], KC[kb + d]); }
    }
    part4[lid] = a.x + a.y + a.z + a.w;
    workgroupBarrier();
    if (quarter == 0u && j < CH) {
        sc[j] = select(NEG, part4[lid] + part4[lid + 1u] + part4[lid + 2u] + part4[lid + 3u], j < n);
    }
    workgroupBarrier();
    var m = NEG;
    for (var i = 0u; i < n; i++) { m = max(m, sc[i]); }
    workgroupBarrier();
    if (lid < n) { sc[lid] = exp(sc[lid] - m); }      // scores -> unnormalized probabilities
    workgroupBarrier();
    var l = 0.0;
    for (var i = 0u; i < n; i++) { l += sc[i]; }

    // values: vec4 slot lid % HD4, keys part, part + parts, ..., four loads in flight
    let slot = lid % hd4();
    let part = lid / hd4();
    let np = parts();
    var acc = vec4<f32>(0.0);
    if (part < np) {
        let vb = kvh * CTX;
        var i = part;
        for (; i + 3u * np < n; i += 4u * np) {
            let v0 = VC[(vb + (k0 + i) % CTX) * hd4() + slot];
            let v1 = VC[(vb + (k0 + i + np) % CTX) * hd4() + slot];
            let v2 = VC[(vb + (k0 + i + 2u * np) % CTX) * hd4() + slot];
            let v3 = VC[(vb + (k0 + i + 3u * np) % CTX) * hd4() + slot];
            acc += sc[i] * v0 + sc[i + np] * v1 + sc[i + 2u * np] * v2 + sc[i + 3u * np] * v3;
        }
        for (; i < n; i += np) { acc += sc[i] * VC[(vb + (k0 + i) % CTX) * hd4() + slot]; }
    }
    let total = sum_parts(lid, acc, hd4());
    if (lid < hd4()) { PART[pbase + 1u + lid] = total; }
    if (lid == 0u) { PART[pbase] = vec4<f32>(m, l, 0.0, 0.0); }
}

var<workgroup> cw: array<f32, NSPLIT>;      // attend_combine: each split's weight e^(m_s - M) / L

// attend_combine: a workgroup takes CS vec4 slots of the head's output, its threads CS slots by WG / CS parts
// of the splits, so that a long context's hundreds of partials are summed by several workgroups a head, each
// thread's chain of loads 8x shorter than with one workgroup a head and a thread a slot.
override CS: u32 = 16u;

@compute @workgroup_size(WG)
fn attend_combine(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let t = wid.z;
    if (t >= S.n_tokens) { return; }
    let stride = hd4() + 1u;
    let pos = S.pos0 + t;
    let p0 = (t * H + h) * NSPLIT;            // token t, head h's first partial
    let used = min(NSPLIT, (key_end(pos) - query_range(pos) + CH - 1u) / CH);   // the splits that held keys
    // the splits' (m, l) read in parallel, then a max and a sum over the workgroup
    var mx = NEG;
    for (var s = lid; s < used; s += WG) {
        let ml = PART[(p0 + s) * stride];
        cw[s] = ml.x;
        mx = max(mx, ml.x);
    }
    let big = workgroup_max(lid, mx);          // its barriers also publish cw[]
    var l = 0.0;
    for (var s = lid; s < used; s += WG) {
        let e = exp(cw[s] - big);
        l += e * PART[(p0 + s) * stride].y;
        cw[s] = e;
    }
    let total_l = workgroup_sum(lid, l);
    // the weighted sum of the splits' acc: slot wid.y * CS + lid % CS, splits part, part + np, ...
    let slot = wid.y * CS + lid % CS;
    let part = lid / CS;
    let np = WG / CS;
    var acc = vec4<f32>(0.0);
    if (slot < hd4()) {
        var s = part;
        for (; s + 3u * np < used; s += 4u * np) {
            let a0 = PART[(p0 + s) * stride + 1u + slot];
            let a1 = PART[(p0 + s + np) * stride + 1u + slot];
            let a2 = PART[(p0 + s + 2u * np) * stride + 1u + slot];
            let a3 = PART[(p0 + s + 3u * np) * stride + 1u + slot];
            acc += cw[s] * a0 + cw[s + np] * a1 + cw[s + 2u * np] * a2 + cw[s + 3u * np] * a3;
        }
        for (; s < used; s += np) { acc += cw[s] * PART[(p0 + s) * stride + 1u + slot]; }
    }
    let o = sum_parts(lid, acc, CS);
    if (lid < CS && slot < hd4()) { O[(t * H + h) * hd4() + slot] = o / total_l; }
}
