// Prefill attention for wide heads (HD 384-512: Gemma 4's full-attention layers), register-blocked: the
// same contract, inputs and masks as attention_prefill.wgsl (whose 16-row tiles this replaces there), but
// both products of a key tile run as small matrix products with several outputs a thread, so that each
// value read from shared memory feeds several multiply-adds, and a workgroup takes 32 query rows (four
// tokens of an 8-head GQA group rather than two), so the keys and values are read half as often.
//
// A workgroup: RT = 32 query rows (the GH query heads of one KV head for RT / GH consecutive tokens), keys
// in tiles of BK = 64, 256 threads.
//   scores   S = Q K^T (32 x 64): thread lid owns rows rb, rb + 16 (rb = lid / 16) and keys kb, kb + 16,
//            kb + 32, kb + 48 (kb = lid % 16); Q and K pass through shared memory DC vec4 at a time (the
//            next chunk's reads in flight while this one computes).
//   softmax  each row's max and sum over the tile from its 16 threads' partials (shared memory); the
//            running max and sum live in those threads' registers; probabilities to shared memory as
//            [key][4 rows].
//   P V      thread lid owns rows 4q .. 4q + 3 (q = lid / 32) and dims 16 db .. 16 db + 15 (db = lid % 32):
//            16 vec4 accumulators; a warp reads one value row whole (2 KB, coalesced), two keys in flight.
// Needs HD % 128 == 0 and HD <= 512 (HD / 32 dims a thread, at most 4 vec4), RT % GH == 0
// (pyapp.gpu.kernels.attention checks). Dispatch (HKV, ceil(T / (RT / GH))).

//!include attention_shape
override WINDOW: u32 = 0u;
override ALL_KEYS: bool = false;
override BLOCKS: bool = false;   // a query also sees the KL[t] keys after its own (the rest of an image's block)
override GH: u32 = 1u;           // query heads per KV head (H / HKV)

@group(0) @binding(0) var<storage, read> Q: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> KC: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> VC: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> O: array<vec4<f32>>;
@group(0) @binding(4) var<uniform> S: Step;
@group(0) @binding(5) var<storage, read> KL: array<u32>;   // BLOCKS: keys after its own each row of the step sees

const NT: u32 = 256u;
const RT: u32 = 32u;           // query rows a workgroup
const BK: u32 = 64u;           // keys a tile
const DC: u32 = 8u;            // vec4 of Q and K a shared chunk (one Q and two K reads a thread)

var<workgroup> qs: array<vec4<f32>, DC * RT>;          // [vec4 of the chunk][row], times SCALE
var<workgroup> ks: array<vec4<f32>, DC * (BK + 1u)>;   // [vec4 of the chunk][key]
var<workgroup> pt: array<vec4<f32>, BK * RT / 4u>;     // [key][4 rows] probabilities
var<workgroup> red_m: array<f32, RT * 16u>;            // [row][kb] partial maxima, then partial sums
var<workgroup> red_l: array<f32, RT * 16u>;
var<workgroup> row_a: array<f32, RT>;                  // this tile's rescale of each row, then its sum

// Score of row r against key j, or NEG where the row's query may not see it (or has no token).
fn masked(s: f32, r: u32, j: u32, t0: u32) -> f32 {
    let t = t0 + r / GH;
    let pos = S.pos0 + t;
    let ahead = (ALL_KEYS && j < S.pos0 + S.n_tokens) || (BLOCKS && j <= pos + KL[min(t, S.n_tokens - 1u)]);
    let ok = t < S.n_tokens && (j <= pos || ahead) && (WINDOW == 0u || j > pos || pos - j < WINDOW);
    return select(NEG, s, ok);
}

// Row r's query vec4 d (times SCALE): its token clamped into the step (rows past it are masked).
fn q_read(r: u32, d: u32, t0: u32, kvh: u32) -> vec4<f32> {
    let t = min(t0 + r / GH, S.n_tokens - 1u);
    return Q[(t * H + kvh * GH + r % GH) * (HD / 4u) + d] * SCALE;
}

// Key j's vec4 d, zeros past the last key any row sees.
fn k_read(kvh: u32, j: u32, hi: u32, d: u32) -> vec4<f32> {
    return select(vec4<f32>(0.0), KC[(kvh * CTX + min(j, hi) % CTX) * (HD / 4u) + d], j <= hi);
}

// acc[4 r + i] += p[r] * v[i]: four rows times this thread's (up to) 16 dims of one key.
fn pv(acc: ptr<function, array<vec4<f32>, 16>>, p: vec4<f32>, v: array<vec4<f32>, 4>) {
    (*acc)[0] = fma(vec4<f32>(p.x), v[0], (*acc)[0]);
    (*acc)[1] = fma(vec4<f32>(p.x), v[1], (*acc)[1]);
    (*acc)[2] = fma(vec4<f32>(p.x), v[2], (*acc)[2]);
    (*acc)[3] = fma(vec4<f32>(p.x), v[3], (*acc)[3]);
    (*acc)[4] = fma(vec4<f32>(p.y), v[0], (*acc)[4]);
    (*acc)[5] = fma(vec4<f32>(p.y), v[1], (*acc)[5]);
    (*acc)[6] = fma(vec4<f32>(p.y), v[2], (*acc)[6]);
    (*acc)[7] = fma(vec4<f32>(p.y), v[3], (*acc)[7]);
    (*acc)[8] = fma(vec4<f32>(p.z), v[0], (*acc)[8]);
    (*acc)[9] = fma(vec4<f32>(p.z), v[1], (*acc)[9]);
    (*acc)[10] = fma(vec4<f32>(p.z), v[2], (*acc)[10]);
    (*acc)[11] = fma(vec4<f32>(p.z), v[3], (*acc)[11]);
    (*acc)[12] = fma(vec4<f32>(p.w), v[0], (*acc)[12]);
    (*acc)[13] = fma(vec4<f32>(p.w), v[1], (*acc)[13]);
    (*acc)[14] = fma(vec4<f32>(p.w), v[2], (*acc)[14]);
    (*acc)[15] = fma(vec4<f32>(p.w), v[3], (*acc)[15]);
}

// Key j's values at this thread's dims (vec4 db * V4 ..): V4 = HD / 128 of them, zeros after.
fn v_read(kvh: u32, j: u32, db: u32) -> array<vec4<f32>, 4> {
    let v4 = HD / 128u;
    let base = (kvh * CTX + j % CTX) * (HD / 4u) + db * v4;
    var v: array<vec4<f32>, 4>;
    v[0] = VC[base];
    v[1] = select(vec4<f32>(0.0), VC[base + min(1u, v4 - 1u)], v4 > 1u);
    v[2] = select(vec4<f32>(0.0), VC[base + min(2u, v4 - 1u)], v4 > 2u);
    v[3] = select(vec4<f32>(0.0), VC[base + min(3u, v4 - 1u)], v4 > 3u);
    return v;
}

// Row r of the tile's rows: output vec4 d = acc / the row's sum.
fn write_row(r: u32, d: u32, acc: vec4<f32>, t0: u32, kvh: u32) {
    let t = t0 + r / GH;
    if (t < S.n_tokens) { O[(t * H + kvh * GH + r % GH) * (HD / 4u) + d] = acc / row_a[r]; }
}

@compute @workgroup_size(NT)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let hd4 = HD / 4u;
    let v4 = HD / 128u;
    let kvh = wid.x;
    let t0 = wid.y * (RT / GH);
    if (t0 >= S.n_tokens) { return; }               // the plan is sized for its longest step
    let t_last = min(t0 + RT / GH, S.n_tokens) - 1u;
    var hi = select(S.pos0 + t_last, S.pos0 + S.n_tokens - 1u, ALL_KEYS);   // the last key any row sees
    if (BLOCKS) { hi = max(hi, S.pos0 + t_last + KL[t_last]); }
    let p0 = S.pos0 + t0;
    var lo = 0u;                                    // the first key any row sees
    if (WINDOW > 0u && p0 + 1u > WINDOW) { lo = p0 + 1u - WINDOW; }

    let rb = lid / 16u;                             // scores: rows rb, rb + 16; keys kb + 16 i
    let kb = lid % 16u;
    let lr = lid / DC;                              // chunk loads: Q row lr, keys lr and lr + 32, vec4 lc
    let lc = lid % DC;
    let q = lid / 32u;                              // P V: rows 4q .. 4q + 3, dims of vec4 db * V4 ..
    let db = lid % 32u;
    var m0 = NEG;                                   // running max and sum of rows rb, rb + 16
    var m1 = NEG;
    var l0 = 0.0;
    var l1 = 0.0;
    var acc: array<vec4<f32>, 16>;                  // indexed by constants only (registers)
    for (var k0 = lo; k0 <= hi; k0 += BK) {
        // scores of rows rb, rb + 16 against keys kb + 16 i
        var s: array<f32, 8>;
        s = array<f32, 8>();                        // zeroed by a statement: a declaration's zero may be hoisted out of the loop
        var qv = q_read(lr, lc, t0, kvh);
        var ka = k_read(kvh, k0 + lr, hi, lc);
        var kz = k_read(kvh, k0 + lr + 32u, hi, lc);
        for (var d0 = 0u; d0 < hd4; d0 += DC) {
            qs[lc * RT + lr] = qv;
            ks[lc * (BK + 1u) + lr] = ka;
            ks[lc * (BK + 1u) + lr + 32u] = kz;
            workgroupBarrier();
            let dn = min(d0 + DC, hd4 - DC) + lc;   // the next chunk's reads (the last chunk reads itself again)
            qv = q_read(lr, dn, t0, kvh);
            ka = k_read(kvh, k0 + lr, hi, dn);
            kz = k_read(kvh, k0 + lr + 32u, hi, dn);
            for (var c = 0u; c < DC; c++) {
                let qa = qs[c * RT + rb];
                let qb = qs[c * RT + rb + 16u];
                let kr = c * (BK + 1u) + kb;
                let k0v = ks[kr];
                let k1v = ks[kr + 16u];
                let k2v = ks[kr + 32u];
                let k3v = ks[kr + 48u];
                s[0] += dot(qa, k0v);
                s[1] += dot(qa, k1v);
                s[2] += dot(qa, k2v);
                s[3] += dot(qa, k3v);
                s[4] += dot(qb, k0v);
                s[5] += dot(qb, k1v);
                s[6] += dot(qb, k2v);
                s[7] += dot(qb, k3v);
            }
            workgroupBarrier();
        }
        // masks, then each row's tile max from its 16 threads
        s[0] = masked(s[0], rb, k0 + kb, t0);
        s[1] = masked(s[1], rb, k0 + kb + 16u, t0);
        s[2] = masked(s[2], rb, k0 + kb + 32u, t0);
        s[3] = masked(s[3], rb, k0 + kb + 48u, t0);
        s[4] = masked(s[4], rb + 16u, k0 + kb, t0);
        s[5] = masked(s[5], rb + 16u, k0 + kb + 16u, t0);
        s[6] = masked(s[6], rb + 16u, k0 + kb + 32u, t0);
        s[7] = masked(s[7], rb + 16u, k0 + kb + 48u, t0);
        red_m[rb * 16u + kb] = max(max(s[0], s[1]), max(s[2], s[3]));
        red_m[(rb + 16u) * 16u + kb] = max(max(s[4], s[5]), max(s[6], s[7]));
        workgroupBarrier();
        var t_m0 = NEG;
        var t_m1 = NEG;
        for (var i = 0u; i < 16u; i++) {
            t_m0 = max(t_m0, red_m[rb * 16u + i]);
            t_m1 = max(t_m1, red_m[(rb + 16u) * 16u + i]);
        }
        let n0 = max(m0, t_m0);
        let n1 = max(m1, t_m1);
        // probabilities (0 where masked) into pt[key][row quad], their partial sums
        var p: array<f32, 8>;
        p[0] = select(0.0, exp(s[0] - n0), s[0] > 0.5 * NEG);
        p[1] = select(0.0, exp(s[1] - n0), s[1] > 0.5 * NEG);
        p[2] = select(0.0, exp(s[2] - n0), s[2] > 0.5 * NEG);
        p[3] = select(0.0, exp(s[3] - n0), s[3] > 0.5 * NEG);
        p[4] = select(0.0, exp(s[4] - n1), s[4] > 0.5 * NEG);
        p[5] = select(0.0, exp(s[5] - n1), s[5] > 0.5 * NEG);
        p[6] = select(0.0, exp(s[6] - n1), s[6] > 0.5 * NEG);
        p[7] = select(0.0, exp(s[7] - n1), s[7] > 0.5 * NEG);
        let qa = rb / 4u;
        let qb = (rb + 16u) / 4u;
        let ca = rb % 4u;
        pt[kb * (RT / 4u) + qa][ca] = p[0];
        pt[(kb + 16u) * (RT / 4u) + qa][ca] = p[1];
        pt[(kb + 32u) * (RT / 4u) + qa][ca] = p[2];
        pt[(kb + 48u) * (RT / 4u) + qa][ca] = p[3];
        pt[kb * (RT / 4u) + qb][ca] = p[4];
        pt[(kb + 16u) * (RT / 4u) + qb][ca] = p[5];
        pt[(kb + 32u) * (RT / 4u) + qb][ca] = p[6];
        pt[(kb + 48u) * (RT / 4u) + qb][ca] = p[7];
        red_l[rb * 16u + kb] = p[0] + p[1] + p[2] + p[3];
        red_l[(rb + 16u) * 16u + kb] = p[4] + p[5] + p[6] + p[7];
        let a0 = exp(m0 - n0);                      // 1 while both are NEG (nothing accumulated yet)
        let a1 = exp(m1 - n1);
        if (kb == 0u) {
            row_a[rb] = a0;
            row_a[rb + 16u] = a1;
        }
        m0 = n0;
        m1 = n1;
        workgroupBarrier();
        var t_l0 = 0.0;
        var t_l1 = 0.0;
        for (var i = 0u; i < 16u; i++) {
            t_l0 += red_l[rb * 16u + i];
            t_l1 += red_l[(rb + 16u) * 16u + i];
        }
        l0 = l0 * a0 + t_l0;
        l1 = l1 * a1 + t_l1;
        // P V: rescale rows 4q .. 4q + 3, then every key of the tile, two keys' values in flight
        let a = vec4<f32>(row_a[4u * q], row_a[4u * q + 1u], row_a[4u * q + 2u], row_a[4u * q + 3u]);
        for (var i = 0u; i < 4u; i++) {
            acc[i] *= a.x;
            acc[4u + i] *= a.y;
            acc[8u + i] *= a.z;
            acc[12u + i] *= a.w;
        }
        let kn = min(BK, hi + 1u - k0);           // keys of this tile any row sees
        var j = 0u;
        for (; j + 1u < kn; j += 2u) {
            let va = v_read(kvh, k0 + j, db);
            let vb = v_read(kvh, k0 + j + 1u, db);
            pv(&acc, pt[j * (RT / 4u) + q], va);
            pv(&acc, pt[(j + 1u) * (RT / 4u) + q], vb);
        }
        if (j < kn) { pv(&acc, pt[j * (RT / 4u) + q], v_read(kvh, k0 + j, db)); }
        // (the next tile writes red_m, red_l, pt and row_a only after its scores' barriers)
    }
    workgroupBarrier();                             // every thread done reading row_a's rescales
    if (kb == 0u) {
        row_a[rb] = l0;
        row_a[rb + 16u] = l1;
    }
    workgroupBarrier();
    for (var i = 0u; i < 4u; i++) {
        if (i < v4) {
            write_row(4u * q, db * v4 + i, acc[i], t0, kvh);
            write_row(4u * q + 1u, db * v4 + i, acc[4u + i], t0, kvh);
            write_row(4u * q + 2u, db * v4 + i, acc[8u + i], t0, kvh);
            write_row(4u * q + 3u, db * v4 + i, acc[12u + i], t0, kvh);
        }
    }
}
