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
// Each thread owns TM rows (4 or 8: row groups tx and tx + TX of 4) x 4 tokens. Shared tiles are
// word-major ([word][rows / tokens] as vec4); the next step's loads are read into registers while
// the current one computes. Jobs: W row jr, half jh (threads < 2 BM); X row xt, quarter xc (words
// 4 xc .. 4 xc + 3 of its step; threads < 4 BN).
//
// Tile shape MQ_BM, MQ_BN, MQ_TM comes from the prelude (pyapp.gpu.kernels.Q8Tile checks it).
// The includer declares K (a multiple of the format's Q8_W_ALIGN), XQ (array<vec4<u32>> [rows, K / 16]),
// XS (array<vec4<f32>> [rows, K / 64]: (d, sum) of two blocks) and
//   fn q8_w_row(i: u32) -> u32   W row for tile row i (any valid row past the end)
//   fn q8_x_row(i: u32) -> u32   X row for tile token i (any valid row past the end)
// and calls q8_tile_product(lid, k_lo, k_hi) from uniform control flow (it has barriers) for the weights
// k_lo .. k_hi - 1 of each row (multiples of 64: all of K, or a slice of it). Result lo[i][j] (and
// hi[i][j] for TM = 8): tile row q8_tile_row(lid, 0 (1), i), tile token q8_tile_token(lid, j).

const BM: u32 = MQ_BM;
const BN: u32 = MQ_BN;
const TM: u32 = MQ_TM;
const GM: u32 = BM / 4u;                 // vec4 groups of rows in a shared word
const TX: u32 = BM / TM;                 // threads along the rows
const GN: u32 = BN / 4u;                 // threads along the tokens (4 each)
const NT: u32 = TX * GN;                 // threads per workgroup (>= 2 BM and >= 4 BN: one job each)

struct Q8Acc {
    lo: mat4x4<f32>,     // rows of group tx
    hi: mat4x4<f32>,     // rows of group tx + TX (TM = 8)
}

fn q8_tile_row(lid: u32, g: u32, i: u32) -> u32 { return 4u * (lid % TX + g * TX) + i; }
fn q8_tile_token(lid: u32, j: u32) -> u32 { return 4u * (lid / TX) + j; }

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

fn q8_tile_product(lid: u32, k_lo: u32, k_hi: u32) -> Q8Acc {
    let tx = lid % TX;
    let ty = lid / TX;
    // W jobs: row jr, half jh of its step (q8_w_fetch)
    let has_w = lid < 2u * BM;
    let jr = lid % BM;
    let jh = lid / BM;
    let wrow = q8_w_row(jr);
    // X jobs: token xt, quarter xc (words 4 xc .. 4 xc + 3 of its 64 codes); quarter 0 also the scales
    let has_x = lid < 4u * BN;
    let xt = lid % BN;
    let xc = lid / BN;
    let xrow = q8_x_row(xt);

    var wj = WJob(vec4<u32>(0u), vec4<u32>(0u), vec2<f32>(0.0));
    var xq = vec4<u32>(0u);
    var xsc = vec4<f32>(0.0);            // (d, sum) of the chunk's two activation blocks
    if (has_w) { wj = q8_w_fetch(wrow, jh, k_lo); }
    if (has_x) {
        xq = XQ[xrow * (K / 16u) + k_lo / 16u + xc];
        xsc = XS[xrow * (K / 64u) + k_lo / 64u];
    }
    var acc = mat4x4<f32>();             // acc[i][j]: row 4 tx + i, token 4 ty + j
    var acc2 = mat4x4<f32>();            // row 4 (tx + TX) + i (TM = 8)
    for (var k0 = k_lo; k0 < k_hi; k0 += 64u) {
        if (has_w) { q8_w_store(wj, jr, jh, k0); }
        if (has_x) {
            for (var m = 0u; m < 4u; m++) {
                xs[(4u * xc + m) * GN + xt / 4u][xt % 4u] = xq[m];
            }
            if (xc == 0u) {
                xd[xt / 4u][xt % 4u] = xsc.x;
                xm[xt / 4u][xt % 4u] = xsc.y;
                xd[GN + xt / 4u][xt % 4u] = xsc.z;
                xm[GN + xt / 4u][xt % 4u] = xsc.w;
            }
        }
        workgroupBarrier();
        let k1 = k0 + 64u;               // the next step's loads, in flight during this one's products
        if (k1 < k_hi) {
            if (has_w) { wj = q8_w_fetch(wrow, jh, k1); }
            if (has_x) {
                xq = XQ[xrow * (K / 16u) + k1 / 16u + xc];
                xsc = XS[xrow * (K / 64u) + k1 / 64u];
            }
        }
        for (var u = 0u; u < 2u * Q8_SUBS; u++) {     // the step's sub-blocks: 2 x Q8_SUBS of 32 / Q8_SUBS
            var i0 = vec4<i32>(SUM_BIAS);
            var i1 = vec4<i32>(SUM_BIAS);
            var i2 = vec4<i32>(SUM_BIAS);
            var i3 = vec4<i32>(SUM_BIAS);
            var i4 = vec4<i32>(SUM_BIAS);
            var i5 = vec4<i32>(SUM_BIAS);
            var i6 = vec4<i32>(SUM_BIAS);
            var i7 = vec4<i32>(SUM_BIAS);
            for (var kk = u * (8u / Q8_SUBS); kk < (u + 1u) * (8u / Q8_SUBS); kk++) {
                let w = ws[kk * GM + tx];
                let x = xs[kk * GN + ty];
                i0 += vec4<i32>(dot4I8Packed(w.x, x.x), dot4I8Packed(w.x, x.y), dot4I8Packed(w.x, x.z),
                                dot4I8Packed(w.x, x.w));
                i1 += vec4<i32>(dot4I8Packed(w.y, x.x), dot4I8Packed(w.y, x.y), dot4I8Packed(w.y, x.z),
                                dot4I8Packed(w.y, x.w));
                i2 += vec4<i32>(dot4I8Packed(w.z, x.x), dot4I8Packed(w.z, x.y), dot4I8Packed(w.z, x.z),
                                dot4I8Packed(w.z, x.w));
                i3 += vec4<i32>(dot4I8Packed(w.w, x.x), dot4I8Packed(w.w, x.y), dot4I8Packed(w.w, x.z),
                                dot4I8Packed(w.w, x.w));
                if (TM == 8u) {
                    let v = ws[kk * GM + tx + TX];
                    i4 += vec4<i32>(dot4I8Packed(v.x, x.x), dot4I8Packed(v.x, x.y), dot4I8Packed(v.x, x.z),
                                    dot4I8Packed(v.x, x.w));
                    i5 += vec4<i32>(dot4I8Packed(v.y, x.x), dot4I8Packed(v.y, x.y), dot4I8Packed(v.y, x.z),
                                    dot4I8Packed(v.y, x.w));
                    i6 += vec4<i32>(dot4I8Packed(v.z, x.x), dot4I8Packed(v.z, x.y), dot4I8Packed(v.z, x.z),
                                    dot4I8Packed(v.z, x.w));
                    i7 += vec4<i32>(dot4I8Packed(v.w, x.x), dot4I8Packed(v.w, x.y), dot4I8Packed(v.w, x.z),
                                    dot4I8Packed(v.w, x.w));
                }
            }
            let s = u / Q8_SUBS;                      // the activations' 32-block
            let a = wa[u * GM + tx];
            let d = xd[s * GN + ty];
            acc[0] += q8_sum(i0) * (a.x * d);
            acc[1] += q8_sum(i1) * (a.y * d);
            acc[2] += q8_sum(i2) * (a.z * d);
            acc[3] += q8_sum(i3) * (a.w * d);
            if (TM == 8u) {
                let a2 = wa[u * GM + tx + TX];
                acc2[0] += q8_sum(i4) * (a2.x * d);
                acc2[1] += q8_sum(i5) * (a2.y * d);
                acc2[2] += q8_sum(i6) * (a2.z * d);
                acc2[3] += q8_sum(i7) * (a2.w * d);
            }
            if (Q8_MIN_TERM) {                        // - b sum x (formats whose b is never 0)
                let b = wb[u * GM + tx];
                let m = xm[s * GN + ty];
                acc[0] -= b.x * m;
                acc[1] -= b.y * m;
                acc[2] -= b.z * m;
                acc[3] -= b.w * m;
                if (TM == 8u) {
                    let b2 = wb[u * GM + tx + TX];
                    acc2[0] -= b2.x * m;
                    acc2[1] -= b2.y * m;
                    acc2[2] -= b2.z * m;
                    acc2[3] -= b2.w * m;
                }
            }
        }
        workgroupBarrier();
    }
    return Q8Acc(acc, acc2);
}
