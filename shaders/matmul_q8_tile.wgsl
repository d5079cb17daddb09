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
//   fn q8_w_store(j: WJob, r: u32, jh: u32, k: u32)       its 8 words of codes and scales: put_codes, put_scales
// Each thread owns TM rows (4 or 8: tx + TX i) x TN tokens (4 or 8: token groups ty and ty + TY of 4):
// eight tokens halve the shared-memory reads a DP4A needs. W's shared tile is row-major ([row][16 words
// of the step], a vec4 a read: 4 words of one row; ws_at), X's word-major ([word][tokens 4h .. 4h + 3]): every
// vec4 in shared memory is written whole by one invocation (stores by component from neighbouring
// invocations are a data race in WGSL, and Metal's and D3D's compilers may write the whole vector:
// gpuweb#2112). The next step's loads are read into registers while the current one computes. Load jobs
// (job lid + j NT): W row jr, half jh (2 BM of them, WJOBS a thread); X tokens 4 h .. 4 h + 3, quarter xc
// (their words 4 xc .. 4 xc + 3 of the step: BN of them, XJOBS a thread).
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
const TX: u32 = BM / TM;                 // threads along the rows
const GN: u32 = BN / 4u;                 // vec4 groups of tokens in a shared word
const TY: u32 = BN / TN;                 // threads along the tokens
const NT: u32 = TX * TY;                 // threads per workgroup
const WJOBS: u32 = (2u * BM + NT - 1u) / NT;
const XJOBS: u32 = (BN + NT - 1u) / NT;

struct Q8Acc {
    lo: mat4x4<f32>,     // rows tx + TX i (i < 4), tokens of group ty
    hi: mat4x4<f32>,     // rows tx + TX (4 + i) (TM = 8)
    lo2: mat4x4<f32>,    // tokens of group ty + TY (TN = 8)
    hi2: mat4x4<f32>,    // both
}

fn q8_tile_row(lid: u32, g: u32, i: u32) -> u32 { return lid % TX + TX * (4u * g + i); }
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

var<workgroup> ws: array<vec4<u32>, 4u * BM>;    // [row][words 4q .. 4q + 3 of the step]: codes, 4 to a word
var<workgroup> wsc: array<vec2<f32>, 2u * BM>;   // [job half][row]: (a, b) of its 32 weights (Q6_K: a, a')
var<workgroup> xs: array<vec4<u32>, 16u * GN>;   // [word][tokens 4h .. 4h + 3]
var<workgroup> xsc: array<vec4<f32>, 4u * GN>;   // [d of block 0, its sum of x, d of block 1, its sum][tokens]

// Row r's words 4q .. 4q + 3 in ws: its 4 vec4 in an order that turns with r, so that the rows 8 consecutive
// threads read (or store) at one q fall in 8 different 16-byte bank groups (a quarter-warp's 16-byte reads
// are one wavefront then), without padding the rows (the tile within WebGPU's default 16 KiB).
fn ws_at(r: u32, q: u32) -> u32 { return 4u * r + (q ^ ((r >> 1u) & 3u)); }

// The format's stores (q8_w_store) for tile row r: words 4q .. 4q + 3 of its step; job half h's scales
fn put_codes(r: u32, q: u32, v: vec4<u32>) { ws[ws_at(r, q)] = v; }
fn put_scales(h: u32, r: u32, v: vec2<f32>) { wsc[h * BM + r] = v; }

// A W load job's registers: what q8_w_fetch read for one row's half step, for q8_w_store.
struct WJob {
    p: vec4<u32>,
    q: vec4<u32>,
    ab: vec2<f32>,
}

// An X load job's registers: words 4 xc .. 4 xc + 3 of 4 tokens, and component xc of their XS (d0, m0, d1, m1)
struct XJob {
    t0: vec4<u32>,
    t1: vec4<u32>,
    t2: vec4<u32>,
    t3: vec4<u32>,
    sc: vec4<f32>,
}

fn x_fetch(job: u32, k: u32) -> XJob {
    let h = job % GN;
    let xc = job / GN;
    let r0 = q8_x_row(4u * h);
    let r1 = q8_x_row(4u * h + 1u);
    let r2 = q8_x_row(4u * h + 2u);
    let r3 = q8_x_row(4u * h + 3u);
    let q = k / 16u + xc;
    let s = k / 64u;
    return XJob(XQ[r0 * (K / 16u) + q], XQ[r1 * (K / 16u) + q], XQ[r2 * (K / 16u) + q], XQ[r3 * (K / 16u) + q],
                vec4<f32>(XS[r0 * (K / 64u) + s][xc], XS[r1 * (K / 64u) + s][xc], XS[r2 * (K / 64u) + s][xc],
                          XS[r3 * (K / 64u) + s][xc]));
}

// the job's 4 x 4 words transposed: word 4 xc + m of the 4 tokens in one vec4
fn x_store(j: XJob, job: u32) {
    let h = job % GN;
    let xc = job / GN;
    xs[(4u * xc) * GN + h] = vec4<u32>(j.t0.x, j.t1.x, j.t2.x, j.t3.x);
    xs[(4u * xc + 1u) * GN + h] = vec4<u32>(j.t0.y, j.t1.y, j.t2.y, j.t3.y);
    xs[(4u * xc + 2u) * GN + h] = vec4<u32>(j.t0.z, j.t1.z, j.t2.z, j.t3.z);
    xs[(4u * xc + 3u) * GN + h] = vec4<u32>(j.t0.w, j.t1.w, j.t2.w, j.t3.w);
    xsc[xc * GN + h] = j.sc;
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

// a word of one row's codes (w) times a word of 4 tokens (x)
fn dots(w: u32, x: vec4<u32>) -> vec4<i32> {
    return vec4<i32>(dot4I8Packed(w, x.x), dot4I8Packed(w, x.y), dot4I8Packed(w, x.z), dot4I8Packed(w, x.w));
}

// s plus one row's 4 words of codes (w) times 4 words of 4 tokens (x0 .. x3: word c of each token in xc)
fn row_dots(s: vec4<i32>, w: vec4<u32>, x0: vec4<u32>, x1: vec4<u32>, x2: vec4<u32>, x3: vec4<u32>) -> vec4<i32> {
    return s + dots(w.x, x0) + dots(w.y, x1) + dots(w.z, x2) + dots(w.w, x3);
}

// 4 words of the tokens of group h: word 4q + c in x[c]
struct X4 {
    x0: vec4<u32>,
    x1: vec4<u32>,
    x2: vec4<u32>,
    x3: vec4<u32>,
}

fn x_words(q: u32, h: u32) -> X4 {
    return X4(xs[(4u * q) * GN + h], xs[(4u * q + 1u) * GN + h], xs[(4u * q + 2u) * GN + h],
              xs[(4u * q + 3u) * GN + h]);
}

// s plus rows tx + TX (4 g + i) (i < 4) times x over words 4q .. 4q + 3
fn add_dots(s: Sums4, tx: u32, g: u32, q: u32, x: X4) -> Sums4 {
    let r = tx + 4u * g * TX;
    return Sums4(row_dots(s.r0, ws[ws_at(r, q)], x.x0, x.x1, x.x2, x.x3),
                 row_dots(s.r1, ws[ws_at(r + TX, q)], x.x0, x.x1, x.x2, x.x3),
                 row_dots(s.r2, ws[ws_at(r + 2u * TX, q)], x.x0, x.x1, x.x2, x.x3),
                 row_dots(s.r3, ws[ws_at(r + 3u * TX, q)], x.x0, x.x1, x.x2, x.x3));
}

// (a, b) of sub-block u for rows tx + TX (4 g + i): a in .x of each, b in .y (b = 0 where Q8_SUBS = 2)
struct Scales4 {
    a: vec4<f32>,
    b: vec4<f32>,
}

fn scales(tx: u32, g: u32, u: u32) -> Scales4 {
    let r = tx + 4u * g * TX;
    let h = u / Q8_SUBS;
    let s0 = wsc[h * BM + r];
    let s1 = wsc[h * BM + r + TX];
    let s2 = wsc[h * BM + r + 2u * TX];
    let s3 = wsc[h * BM + r + 3u * TX];
    if (Q8_SUBS == 2u) {
        if (u % 2u == 0u) { return Scales4(vec4<f32>(s0.x, s1.x, s2.x, s3.x), vec4<f32>(0.0)); }
        return Scales4(vec4<f32>(s0.y, s1.y, s2.y, s3.y), vec4<f32>(0.0));
    }
    return Scales4(vec4<f32>(s0.x, s1.x, s2.x, s3.x), vec4<f32>(s0.y, s1.y, s2.y, s3.y));
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
    var xj: array<XJob, XJOBS>;          // X jobs: tokens 4 (job % GN) .., quarter (job / GN)
    for (var j = 0u; j < WJOBS; j++) {
        let job = lid + j * NT;
        if (job < 2u * BM) { wj[j] = q8_w_fetch(q8_w_row(job % BM), job / BM, k_lo); }
    }
    for (var j = 0u; j < XJOBS; j++) {
        let job = lid + j * NT;
        if (job < BN) { xj[j] = x_fetch(job, k_lo); }
    }
    var acc = Q8Acc(mat4x4<f32>(), mat4x4<f32>(), mat4x4<f32>(), mat4x4<f32>());
    for (var k0 = k_lo; k0 < k_hi; k0 += 64u) {
        for (var j = 0u; j < WJOBS; j++) {
            let job = lid + j * NT;
            if (job < 2u * BM) { q8_w_store(wj[j], job % BM, job / BM, k0); }
        }
        for (var j = 0u; j < XJOBS; j++) {
            let job = lid + j * NT;
            if (job < BN) { x_store(xj[j], job); }
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
                if (job < BN) { xj[j] = x_fetch(job, k1); }
            }
        }
        for (var u = 0u; u < 2u * Q8_SUBS; u++) {     // the step's sub-blocks: 2 x Q8_SUBS of 32 / Q8_SUBS
            var s00 = sums_start();                   // rows tx + TX i x tokens of group ty
            var s10 = sums_start();                   // rows tx + TX (4 + i) (TM = 8)
            var s01 = sums_start();                   // tokens ty + TY (TN = 8)
            var s11 = sums_start();
            for (var q = u * (2u / Q8_SUBS); q < (u + 1u) * (2u / Q8_SUBS); q++) {   // 4 words at a time
                let x = x_words(q, ty);
                s00 = add_dots(s00, tx, 0u, q, x);
                if (TM == 8u) { s10 = add_dots(s10, tx, 1u, q, x); }
                if (TN == 8u) {
                    let x2 = x_words(q, ty + TY);
                    s01 = add_dots(s01, tx, 0u, q, x2);
                    if (TM == 8u) { s11 = add_dots(s11, tx, 1u, q, x2); }
                }
            }
            let s = u / Q8_SUBS;                      // the activations' 32-block
            let sc = scales(tx, 0u, u);
            let d = xsc[2u * s * GN + ty];
            acc.lo = add_scaled(acc.lo, s00, sc.a, d);
            var sc2 = Scales4(vec4<f32>(0.0), vec4<f32>(0.0));
            var d2 = vec4<f32>(0.0);
            if (TM == 8u) {
                sc2 = scales(tx, 1u, u);
                acc.hi = add_scaled(acc.hi, s10, sc2.a, d);
            }
            if (TN == 8u) {
                d2 = xsc[2u * s * GN + ty + TY];
                acc.lo2 = add_scaled(acc.lo2, s01, sc.a, d2);
                if (TM == 8u) { acc.hi2 = add_scaled(acc.hi2, s11, sc2.a, d2); }
            }
            if (Q8_MIN_TERM) {                        // - b sum x (formats whose b is never 0)
                let m = xsc[(2u * s + 1u) * GN + ty];
                acc.lo = less_offsets(acc.lo, sc.b, m);
                if (TM == 8u) { acc.hi = less_offsets(acc.hi, sc2.b, m); }
                if (TN == 8u) {
                    let m2 = xsc[(2u * s + 1u) * GN + ty + TY];
                    acc.lo2 = less_offsets(acc.lo2, sc.b, m2);
                    if (TM == 8u) { acc.hi2 = less_offsets(acc.hi2, sc2.b, m2); }
                }
            }
        }
        workgroupBarrier();
    }
    return acc;
}
