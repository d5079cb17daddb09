// One tile of the int8 prefill matmul, shared by matmul_q8.wgsl and moe_grouped_q8.wgsl: BM rows of W
// (quantized weights whose codes are int8 as they stand, 4 to a word) times BN rows of X (int8 per 32,
// from quantize_q8.wgsl), K 64 weights a step. As llama.cpp's MMQ: a block of 32 weights is
// w = a q - b (Q4_K: a = d sc, b = dmin m; Q4_0 / Q5_0: a = d, b = 8 d / 16 d; Q8_0: b = 0) and an
// activation block x ~ dx qx, so
//   sum_k w x = a dx sum_k q qx - b sum_k x
// with the integer sum exact (dot4I8Packed: DP4A, four multiply-adds an instruction), one float
// fix-up per 32 weights, and the offset term on the exact sum of x.
//
// The weight format comes from an include the prelude names (q8_weights_q4k.wgsl, q8_weights_b32.wgsl,
// q8_weights_q6k.wgsl): it declares W, Q8_W_ALIGN, Q8_SUBS (sub-blocks per 32 weights, each with its own a:
// 1, or 2 for Q6_K's scale per 16, whose b must be 0: the activations' sums are per 32), Q8_MIN_TERM
// (false where b is always 0: Q6_K, Q8_0, which then skip its fix-up and need not store b) and
//   fn q8_w_fetch(row: u32, jh: u32, k: u32) -> WJob     load job jh (0, 1) of a row's step at k
//   fn q8_w_store(j: WJob, r: u32, jh: u32, k: u32)       its 8 words of codes and (a, b) into ws, wa, wb
// Each thread owns TM rows (4 or 8: row groups tx and tx + TX of 4) x TN tokens (4 or 8: token groups ty
// and ty + TY of 4): eight tokens halve the shared-memory reads a DP4A needs. Shared tiles are word-major
// ([word][rows / tokens] as vec4); the next step's loads are read into registers while the current one
// computes. Load jobs, WJOBS and XJOBS a thread (job lid + j NT): W row jr, half jh (2 BM of them); X row
// xt, quarter xc (words 4 xc .. 4 xc + 3 of its step; 4 BN of them).
//
// Tile shape MQ_BM, MQ_BN, MQ_TM, MQ_TN comes from the prelude (pyapp.gpu.kernels.Q8Tile checks it).
// The includer declares K (a multiple of the format's Q8_W_ALIGN), XQ (array<vec4<u32>> [rows, K / 16]),
// XS (array<vec4<f32>> [rows, K / 64]: (d, sum) of two blocks) and
//   fn q8_w_row(i: u32) -> u32   W row for tile row i (any valid row past the end)
//   fn q8_x_row(i: u32) -> u32   X row for tile token i (any valid row past the end)
// and calls q8_tile_product(lid, k_lo, k_hi) from uniform control flow (it has barriers) for the weights
// k_lo .. k_hi - 1 of each row (multiples of 64: all of K, or a slice of it). Result q8_acc(acc, g, h)[i][j]:
// tile row q8_tile_row(lid, g, i), tile token q8_tile_token(lid, h, j) (g < TM / 4, h < TN / 4).

const BM: u32 = MQ_BM;
const BN: u32 = MQ_BN;
const TM: u32 = MQ_TM;
const TN: u32 = MQ_TN;
const GM: u32 = BM / 4u;                 // vec4 groups of rows in a shared word
const TX: u32 = BM / TM;                 // threads along the rows
const GN: u32 = BN / 4u;                 // vec4 groups of tokens in a shared word
const TY: u32 = BN / TN;                 // threads along the tokens
const NT: u32 = TX * TY;                 // threads per workgroup
const WJOBS: u32 = (2u * BM + NT - 1u) / NT;
const XJOBS: u32 = (4u * BN + NT - 1u) / NT;

struct Q8Acc {
    lo: mat4x4<f32>,     // rows of group tx, tokens of group ty
    hi: mat4x4<f32>,     // rows of group tx + TX (TM = 8)
    lo2: mat4x4<f32>,    // tokens of group ty + TY (TN = 8)
    hi2: mat4x4<f32>,    // both
}

fn q8_tile_row(lid: u32, g: u32, i: u32) -> u32 { return 4u * (lid % TX + g * TX) + i; }
fn q8_tile_token(lid: u32, h: u32, j: u32) -> u32 { return 4u * (lid / TX + h * TY) + j; }
fn q8_acc(a: Q8Acc, g: u32, h: u32) -> mat4x4<f32> {
    if (h == 0u) {
        if (g == 0u) { return a.lo; }
        return a.hi;
    }
    if (g == 0u) { return a.lo2; }
    return a.hi2;
}

// The integer sums start at the bits of 1.5 * 2^23, so each reads as that float plus the sum (exact for
// |sum| < 2^22: a sub-block's is at most 32 * 127 * 128) and one float add converts it: an int -> float
// conversion issues at a quarter of the float rate on NVIDIA, once a product a sub-block.
const SUM_BIAS: i32 = 0x4b400000;
const SUM_BIAS_F: f32 = 12582912.0;
fn q8_sum(i: vec4<i32>) -> vec4<f32> { return bitcast<vec4<f32>>(i) - SUM_BIAS_F; }

var<workgroup> ws: array<vec4<u32>, 16u * GM>;    // [word 0..15][rows 4g .. 4g + 3]: codes, 4 to a word
var<workgroup> wa: array<vec4<f32>, 2u * Q8_SUBS * GM>;   // [sub-block][rows]: a = d sc
var<workgroup> wb: array<vec4<f32>, 2u * Q8_SUBS * GM>;   //                    b = dmin m
var<workgroup> xs: array<vec4<u32>, 16u * GN>;    // [word][tokens 4h .. 4h + 3]
var<workgroup> xd: array<vec4<f32>, 2u * GN>;     // [sub-block][tokens]: activation scale
var<workgroup> xm: array<vec4<f32>, 2u * GN>;     //                      sum of the block's x

// A W load job's registers: what q8_w_fetch read for one row's half step, for q8_w_store.
struct WJob {
    p: vec4<u32>,
    q: vec4<u32>,
    ab: vec2<f32>,
}

// Integer sums of 4 rows x 4 tokens (row i's sums over tokens in r[i]), biased by SUM_BIAS.
struct Sums4 {
    r0: vec4<i32>,
    r1: vec4<i32>,
    r2: vec4<i32>,
    r3: vec4<i32>,
}

fn sums_start() -> Sums4 {
    return Sums4(vec4<i32>(SUM_BIAS), vec4<i32>(SUM_BIAS), vec4<i32>(SUM_BIAS), vec4<i32>(SUM_BIAS));
}

fn dots(w: u32, x: vec4<u32>) -> vec4<i32> {
    return vec4<i32>(dot4I8Packed(w, x.x), dot4I8Packed(w, x.y), dot4I8Packed(w, x.z), dot4I8Packed(w, x.w));
}

// s plus a word of codes of 4 rows (w) times a word of 4 tokens (x)
fn add_dots(s: Sums4, w: vec4<u32>, x: vec4<u32>) -> Sums4 {
    return Sums4(s.r0 + dots(w.x, x), s.r1 + dots(w.y, x), s.r2 + dots(w.z, x), s.r3 + dots(w.w, x));
}

// acc plus a sub-block's sums scaled: row i's a[i] times each token's d
fn add_scaled(acc: mat4x4<f32>, s: Sums4, a: vec4<f32>, d: vec4<f32>) -> mat4x4<f32> {
    return mat4x4<f32>(acc[0] + q8_sum(s.r0) * (a.x * d), acc[1] + q8_sum(s.r1) * (a.y * d),
                       acc[2] + q8_sum(s.r2) * (a.z * d), acc[3] + q8_sum(s.r3) * (a.w * d));
}

// acc minus the offset term: row i's b[i] times each token's sum of x (m)
fn less_offsets(acc: mat4x4<f32>, b: vec4<f32>, m: vec4<f32>) -> mat4x4<f32> {
    return mat4x4<f32>(acc[0] - b.x * m, acc[1] - b.y * m, acc[2] - b.z * m, acc[3] - b.w * m);
}

fn q8_tile_product(lid: u32, k_lo: u32, k_hi: u32) -> Q8Acc {
    let tx = lid % TX;
    let ty = lid / TX;
    // The first step's loads here and the next step's in the loop are the same code, written twice: as one
    // function returning the loads in a struct the chunk took 1.3% longer (E2B on an H200, twelfth session).
    var wj: array<WJob, WJOBS>;          // W jobs: row (job % BM), half (job / BM) of its step
    var xq: array<vec4<u32>, XJOBS>;     // X jobs: token (job % BN), quarter (job / BN) of its 64 codes
    var xsc: array<vec4<f32>, XJOBS>;    // (d, sum) of the step's two activation blocks
    for (var j = 0u; j < WJOBS; j++) {
        let job = lid + j * NT;
        if (job < 2u * BM) { wj[j] = q8_w_fetch(q8_w_row(job % BM), job / BM, k_lo); }
    }
    for (var j = 0u; j < XJOBS; j++) {
        let job = lid + j * NT;
        if (job < 4u * BN) {
            let xrow = q8_x_row(job % BN);
            xq[j] = XQ[xrow * (K / 16u) + k_lo / 16u + job / BN];
            if (job < BN) { xsc[j] = XS[xrow * (K / 64u) + k_lo / 64u]; }     // quarter 0 stores the scales
        }
    }
    var acc = Q8Acc(mat4x4<f32>(), mat4x4<f32>(), mat4x4<f32>(), mat4x4<f32>());
    for (var k0 = k_lo; k0 < k_hi; k0 += 64u) {
        for (var j = 0u; j < WJOBS; j++) {
            let job = lid + j * NT;
            if (job < 2u * BM) { q8_w_store(wj[j], job % BM, job / BM, k0); }
        }
        for (var j = 0u; j < XJOBS; j++) {
            let job = lid + j * NT;
            let xt = job % BN;
            let xc = job / BN;
            if (job < 4u * BN) {
                for (var m = 0u; m < 4u; m++) {
                    xs[(4u * xc + m) * GN + xt / 4u][xt % 4u] = xq[j][m];
                }
                if (xc == 0u) {
                    xd[xt / 4u][xt % 4u] = xsc[j].x;
                    xm[xt / 4u][xt % 4u] = xsc[j].y;
                    xd[GN + xt / 4u][xt % 4u] = xsc[j].z;
                    xm[GN + xt / 4u][xt % 4u] = xsc[j].w;
                }
            }
        }
        workgroupBarrier();
        let k1 = k0 + 64u;               // the next step's loads, in flight during this one's products
        if (k1 < k_hi) {
            for (var j = 0u; j < WJOBS; j++) {
                let job = lid + j * NT;
                if (job < 2u * BM) { wj[j] = q8_w_fetch(q8_w_row(job % BM), job / BM, k1); }
            }
            for (var j = 0u; j < XJOBS; j++) {
                let job = lid + j * NT;
                if (job < 4u * BN) {
                    let xrow = q8_x_row(job % BN);
                    xq[j] = XQ[xrow * (K / 16u) + k1 / 16u + job / BN];
                    if (job < BN) { xsc[j] = XS[xrow * (K / 64u) + k1 / 64u]; }
                }
            }
        }
        for (var u = 0u; u < 2u * Q8_SUBS; u++) {     // the step's sub-blocks: 2 x Q8_SUBS of 32 / Q8_SUBS
            var s00 = sums_start();                   // rows of group tx x tokens of group ty
            var s10 = sums_start();                   // rows tx + TX (TM = 8)
            var s01 = sums_start();                   // tokens ty + TY (TN = 8)
            var s11 = sums_start();
            for (var kk = u * (8u / Q8_SUBS); kk < (u + 1u) * (8u / Q8_SUBS); kk++) {
                let w = ws[kk * GM + tx];
                let x = xs[kk * GN + ty];
                s00 = add_dots(s00, w, x);
                var v = vec4<u32>(0u);
                if (TM == 8u) {
                    v = ws[kk * GM + tx + TX];
                    s10 = add_dots(s10, v, x);
                }
                if (TN == 8u) {
                    let x2 = xs[kk * GN + ty + TY];
                    s01 = add_dots(s01, w, x2);
                    if (TM == 8u) { s11 = add_dots(s11, v, x2); }
                }
            }
            let s = u / Q8_SUBS;                      // the activations' 32-block
            let a = wa[u * GM + tx];
            let d = xd[s * GN + ty];
            acc.lo = add_scaled(acc.lo, s00, a, d);
            var a2 = vec4<f32>(0.0);
            var d2 = vec4<f32>(0.0);
            if (TM == 8u) {
                a2 = wa[u * GM + tx + TX];
                acc.hi = add_scaled(acc.hi, s10, a2, d);
            }
            if (TN == 8u) {
                d2 = xd[s * GN + ty + TY];
                acc.lo2 = add_scaled(acc.lo2, s01, a, d2);
                if (TM == 8u) { acc.hi2 = add_scaled(acc.hi2, s11, a2, d2); }
            }
            if (Q8_MIN_TERM) {                        // - b sum x (formats whose b is never 0)
                let b = wb[u * GM + tx];
                let m = xm[s * GN + ty];
                acc.lo = less_offsets(acc.lo, b, m);
                var b2 = vec4<f32>(0.0);
                if (TM == 8u) {
                    b2 = wb[u * GM + tx + TX];
                    acc.hi = less_offsets(acc.hi, b2, m);
                }
                if (TN == 8u) {
                    let m2 = xm[s * GN + ty + TY];
                    acc.lo2 = less_offsets(acc.lo2, b, m2);
                    if (TM == 8u) { acc.hi2 = less_offsets(acc.hi2, b2, m2); }
                }
            }
        }
        workgroupBarrier();
    }
    return acc;
}
