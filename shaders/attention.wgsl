// Attention over a KV cache: decode and prefill (causal, optional sliding window, GQA).
//
// Mirrors reference.forward attention: softmax(SCALE * q k^T + mask) v, keys at
// positions j with j <= p and (WINDOW == 0 or p - j < WINDOW) for a query at p.
// Q, O: f32 [T, H, HD]; token t is at position p = S.pos0 + t, S.n_tokens = T
// (S: Step, the per-step uniform; it and DECODE_KEYS_PER_GROUP come from the prelude
// pyapp.gpu.kernels generates).
// KC, VC: f32 [HKV, CTX, HD]; position j lives in slot j % CTX (a ring of CTX
// >= WINDOW slots serves sliding layers). Query head h reads kv head h / (H / HKV).
//   store:  writes Kn, Vn [T, HKV, HD] into the caches. Dispatch ceil(T*HKV*HD/64).
//   attend: one workgroup per (GH query heads of one KV head, token), keys in chunks of WG
//           with an online softmax; each thread owns output dims lid, lid + WG, ... (HD <= 4 WG).
//           Dispatch (H / GH, T).

override H: u32;
override HKV: u32;
override HD: u32;
override CTX: u32;
override WINDOW: u32 = 0u;
override SCALE: f32 = 1.0;
override WG: u32 = 128u;

@group(0) @binding(0) var<storage, read> Q: array<f32>;
@group(0) @binding(1) var<storage, read_write> KC: array<f32>;
@group(0) @binding(2) var<storage, read_write> VC: array<f32>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;
@group(0) @binding(4) var<uniform> S: Step;
@group(0) @binding(5) var<storage, read> Kn: array<f32>;
@group(0) @binding(6) var<storage, read> Vn: array<f32>;

//!include sincos

@compute @workgroup_size(64)
fn store(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = gid.x + gid.y * nwg.x * 64u;
    if (id >= S.n_tokens * HKV * HD) { return; }
    let d = id % HD;
    let kh = (id / HD) % HKV;
    let t = id / (HD * HKV);
    let dst = (kh * CTX + (S.pos0 + t) % CTX) * HD + d;
    KC[dst] = Kn[id];
    VC[dst] = Vn[id];
}

const NEG: f32 = -3.0e38;
const MAX_GH: u32 = 8u;                      // query heads a workgroup may serve (GH <= MAX_GH)
override GH: u32 = 1u;                       // attend: query heads per workgroup, all of one KV head

var<workgroup> qs: array<f32, GH * HD>;
var<workgroup> p: array<f32, GH * WG>;
var<workgroup> red: array<f32, GH * WG>;

// Tree over the WG values of each of the GH heads in red[]; is_max: max, else sum. Holds barriers.
fn reduce_heads(lid: u32, is_max: bool) {
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            for (var g = 0u; g < GH; g++) {
                let a = red[g * WG + lid];
                let b = red[g * WG + lid + s];
                red[g * WG + lid] = select(a + b, max(a, b), is_max);
            }
        }
        workgroupBarrier();
    }
}

// attend: workgroup (x, t) serves query heads x*GH .. x*GH+GH-1 (one KV head) of token t, so each
// key and value row is read once for GH heads (GQA: up to 8 query heads share a KV head). Keys in
// chunks of WG with an online softmax per head; thread lid scores key c + lid against every head's
// query and owns output dims lid, lid + WG, ... (HD <= 4 WG). Dispatch (H / GH, T).
@compute @workgroup_size(WG)
fn attend(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h0 = wid.x * GH;
    let t = wid.y;
    let pos = S.pos0 + t;
    let kvh = h0 / (H / HKV);
    var lo = 0u;
    if (WINDOW > 0u && pos + 1u > WINDOW) { lo = pos + 1u - WINDOW; }
    for (var i = lid; i < GH * HD; i += WG) { qs[i] = Q[(t * H + h0) * HD + i] * SCALE; }
    workgroupBarrier();

    var m: array<f32, MAX_GH>;
    var l: array<f32, MAX_GH>;
    var acc: array<f32, 4 * MAX_GH>;         // [head g][dim slot i] at 4g + i
    for (var g = 0u; g < GH; g++) { m[g] = NEG; l[g] = 0.0; }
    for (var i = 0u; i < 4u * GH; i++) { acc[i] = 0.0; }
    for (var c = lo; c <= pos; c += WG) {
        let j = c + lid;
        var score: array<f32, MAX_GH>;
        for (var g = 0u; g < GH; g++) { score[g] = NEG; }
        if (j <= pos) {
            let kb = (kvh * CTX + j % CTX) * HD;
            for (var g = 0u; g < GH; g++) { score[g] = 0.0; }
            for (var d = 0u; d < HD; d++) {
                let k = KC[kb + d];
                for (var g = 0u; g < GH; g++) { score[g] += qs[g * HD + d] * k; }
            }
        }
        for (var g = 0u; g < GH; g++) { red[g * WG + lid] = score[g]; }
        reduce_heads(lid, true);
        var alpha: array<f32, MAX_GH>;
        for (var g = 0u; g < GH; g++) {
            let m_new = max(m[g], red[g * WG]);
            let e = select(0.0, exp(score[g] - m_new), j <= pos);
            alpha[g] = exp(m[g] - m_new);
            m[g] = m_new;
            p[g * WG + lid] = e;
        }
        workgroupBarrier();                  // everyone has read red[] before it is reused
        for (var g = 0u; g < GH; g++) { red[g * WG + lid] = p[g * WG + lid]; }
        reduce_heads(lid, false);            // its barriers also publish p[]
        for (var g = 0u; g < GH; g++) { l[g] = l[g] * alpha[g] + red[g * WG]; }
        let n = min(WG, pos + 1u - c);
        for (var i = 0u; i < 4u; i++) {
            let d = lid + i * WG;
            if (d < HD) {
                for (var g = 0u; g < GH; g++) { acc[4u * g + i] *= alpha[g]; }
                for (var jj = 0u; jj < n; jj++) {
                    let v = VC[(kvh * CTX + (c + jj) % CTX) * HD + d];
                    for (var g = 0u; g < GH; g++) { acc[4u * g + i] += p[g * WG + jj] * v; }
                }
            }
        }
        workgroupBarrier();
    }
    for (var g = 0u; g < GH; g++) {
        for (var i = 0u; i < 4u; i++) {
            let d = lid + i * WG;
            if (d < HD) { O[(t * H + h0 + g) * HD + d] = acc[4u * g + i] / l[g]; }
        }
    }
}

// ---------------------------------------------------------------------------
// Decode attention, split over the keys (one query token, or a few: speculative decoding's token
// and drafts, each its own query at S.pos0 + t; PREP == 0 then):
//   attend_split:   workgroup (h, s, t) covers keys [lo + s*CH, lo + (s+1)*CH) of token t's
//                   query range [lo, pos]; 4 threads per key compute q.k (interleaved
//                   vec4s, coalesced; V reads after too), then writes its partial softmax state
//                   PART[t, h, s] = (max m, sum l, acc[HD]) (m = NEG, l = 0 when empty).
//                   Dispatch (H, NSPLIT, T) with NSPLIT * CH >= the most keys a query sees.
//   attend_combine: O[t, h] = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s over the splits
//                   that held keys (a context sized plan has many empty ones early on). Dispatch (H, 1, T).
// Needs HD % 4 == 0 and HD <= 4 * WG (WG = 128: 4 threads x 32 keys).

override NSPLIT: u32 = 1u;
const CH: u32 = DECODE_KEYS_PER_GROUP;     // keys per attend_split workgroup (4 threads a key)

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

@group(0) @binding(7) var<storage, read_write> PART: array<f32>;
@group(0) @binding(8) var<storage, read> QW: array<f32>;
@group(0) @binding(9) var<storage, read> KW: array<f32>;
@group(0) @binding(10) var<storage, read> FF: array<f32>;

var<workgroup> qd: array<f32, HD>;          // attend_split's query (attend's qs is sized by GH)
var<workgroup> sc: array<f32, CH>;
var<workgroup> part4: array<f32, 128>;

// Sum of v over the 128 threads (part4 as a tree); uniform control flow only.
fn sum128(lid: u32, v: f32) -> f32 {
    workgroupBarrier();
    part4[lid] = v;
    workgroupBarrier();
    for (var st = 64u; st > 0u; st >>= 1u) {
        if (lid < st) { part4[lid] += part4[lid + st]; }
        workgroupBarrier();
    }
    let total = part4[0];
    workgroupBarrier();
    return total;
}

// 1 / rms of the HD raw floats of Q at base.
fn inv_rms_q(base: u32, lid: u32) -> f32 {
    var ss = 0.0;
    for (var d = lid; d < HD; d += 128u) { ss += Q[base + d] * Q[base + d]; }
    return inverseSqrt(sum128(lid, ss) / f32(HD) + EPS);
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

fn query_range(pos: u32) -> u32 {
    if (WINDOW > 0u && pos + 1u > WINDOW) { return pos + 1u - WINDOW; }
    return 0u;
}

@compute @workgroup_size(128)
fn attend_split(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let s = wid.y;
    let t = wid.z;
    if (t >= S.n_tokens) { return; }         // uniform per workgroup
    let pos = S.pos0 + t;
    let kvh = h / (H / HKV);
    let lo = query_range(pos);
    let k0 = lo + s * CH;
    let stride = HD + 2u;
    let pbase = ((t * H + h) * NSPLIT + s) * stride;
    if (k0 > pos) {                          // past the last key: an empty partial
        if (lid == 0u) { PART[pbase] = NEG; PART[pbase + 1u] = 0.0; }
        for (var d = lid; d < HD; d += 128u) { PART[pbase + 2u + d] = 0.0; }
        return;
    }
    let n = min(CH, pos + 1u - k0);
    if (PREP == 0u) {
        for (var d = lid; d < HD; d += 128u) { qd[d] = Q[(t * H + h) * HD + d] * SCALE; }
    } else {
        let qb = QOFF + h * HD;
        let inv_q = inv_rms_q(qb, lid);
        for (var d = lid; d < HD; d += 128u) { qd[d] = prep_dim(qb, d, inv_q, f32(pos), false) * SCALE; }
    }
    if (PREP == 2u && pos < k0 + CH) {       // this split holds the current position: its K, V into the caches
        let kb = KOFF + kvh * HD;
        let vb = VOFF + kvh * HD;
        let inv_k = inv_rms_q(kb, lid);
        let inv_v = inv_rms_q(vb, lid);
        let dst = (kvh * CTX + pos % CTX) * HD;
        for (var d = lid; d < HD; d += 128u) {
            KC[dst + d] = prep_dim(kb, d, inv_k, f32(pos), true);
            VC[dst + d] = Q[vb + d] * inv_v;
        }
        storageBarrier();
    }
    workgroupBarrier();

    // scores: key j = lid / 4; its 4 threads take interleaved vec4s of its dims, so the
    // four read one contiguous 64 bytes at a time (coalesced)
    let j = lid / 4u;
    let quarter = lid % 4u;
    var dotv = 0.0;
    if (j < n) {
        let kb = (kvh * CTX + (k0 + j) % CTX) * HD;
        for (var d = quarter * 4u; d < HD; d += 16u) {
            dotv += dot(vec4<f32>(qd[d], qd[d + 1u], qd[d + 2u], qd[d + 3u]),
                        vec4<f32>(KC[kb + d], KC[kb + d + 1u], KC[kb + d + 2u], KC[kb + d + 3u]));
        }
    }
    part4[lid] = dotv;
    workgroupBarrier();
    if (quarter == 0u) {
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
    for (var d = lid; d < HD; d += 128u) {
        var a = 0.0;
        for (var i = 0u; i < n; i++) { a += sc[i] * VC[(kvh * CTX + (k0 + i) % CTX) * HD + d]; }
        PART[pbase + 2u + d] = a;
    }
    if (lid == 0u) { PART[pbase] = m; PART[pbase + 1u] = l; }
}

var<workgroup> cw: array<f32, NSPLIT>;      // attend_combine: each split's weight e^(m_s - M) / L

@compute @workgroup_size(128)
fn attend_combine(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let t = wid.z;
    if (t >= S.n_tokens) { return; }
    let stride = HD + 2u;
    let pos = S.pos0 + t;
    let p0 = (t * H + h) * NSPLIT;            // token t, head h's first partial
    let used = min(NSPLIT, (pos - query_range(pos)) / CH + 1u);   // the splits that held keys
    var mx = NEG;
    for (var s = 0u; s < used; s++) { mx = max(mx, PART[(p0 + s) * stride]); }
    var l = 0.0;
    for (var s = 0u; s < used; s++) {
        let b = (p0 + s) * stride;
        l += exp(PART[b] - mx) * PART[b + 1u];
    }
    for (var s = lid; s < used; s += 128u) { cw[s] = exp(PART[(p0 + s) * stride] - mx) / l; }
    workgroupBarrier();
    for (var d = lid; d < HD; d += 128u) {
        var a = 0.0;
        for (var s = 0u; s < used; s++) { a += cw[s] * PART[(p0 + s) * stride + 2u + d]; }
        O[(t * H + h) * HD + d] = a;
    }
}
