// One tile of the int8 Q4_K matmul, shared by matmul_q8.wgsl and moe_grouped_q8.wgsl: BM rows of W
// (Q4_K codes as int8, 4 to a word) times BN rows of X (int8 per 32, from quantize_q8.wgsl),
// K 64 weights a step. As llama.cpp's MMQ for Q4_K: a sub-block of 32 weights is w = a q - b
// (a = d sc, b = dmin m) and an activation block x ~ dx qx, so
//   sum_k w x = a dx sum_k q qx - b sum_k x
// with the integer sum exact (dot4I8Packed: DP4A, four multiply-adds an instruction), one float
// fix-up per 32 weights, and the min term on the exact sum of x.
//
// A step reads one 32-byte chunk of qs per row, whose low nibbles are sub-block 2c and high nibbles
// sub-block 2c + 1, each word holding four codes in dot4I8Packed's order (byte i = weight i), so a
// word of nibbles is two words of int8 codes after a mask. Each thread owns TM rows (4 or 8: row
// groups tx and tx + TX of 4) x 4 tokens.
// Shared tiles are word-major ([word][rows / tokens] as vec4); the next step's loads are read into
// registers while the current one computes. Jobs: W row jr, half jh (threads < 2 BM: words 4 jh ..
// 4 jh + 3 of the chunk, half 0 also the scales); X row xt, quarter xc (threads < 4 BN).
//
// Tile shape MQ_BM, MQ_BN, MQ_TM comes from the prelude (pyapp.gpu.kernels.q8_prelude checks it).
// The includer declares K (a multiple of 256), W (array<vec4<u32>>: Q4_K rows, 9 vec4 a block),
// XQ (array<vec4<u32>> [rows, K / 16]), XS (array<vec4<f32>> [rows, K / 64]: (d, sum) of two blocks) and
//   fn q8_w_row(i: u32) -> u32   vec4 index of the W row for tile row i (any valid row past the end)
//   fn q8_x_row(i: u32) -> u32   X row for tile token i (any valid row past the end)
// and calls q8_tile_product from uniform control flow (it has barriers). Result lo[i][j] (and
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

var<workgroup> ws: array<vec4<u32>, 16u * GM>;    // [word 0..15][rows 4g .. 4g + 3]: codes, 4 to a word
var<workgroup> wa: array<vec4<f32>, 2u * GM>;     // [sub-block][rows]: a = d sc
var<workgroup> wb: array<vec4<f32>, 2u * GM>;     //                    b = dmin m
var<workgroup> xs: array<vec4<u32>, 16u * GN>;    // [word][tokens 4h .. 4h + 3]
var<workgroup> xd: array<vec4<f32>, 2u * GN>;     // [sub-block][tokens]: activation scale
var<workgroup> xm: array<vec4<f32>, 2u * GN>;     //                      sum of the block's x

// 6-bit scale and min j (0..7) of a Q4_K block from its 12 scale bytes (words h.y, h.z, h.w of the
// block's first 16 bytes), as get_scale_min_k4
fn scale_min(h: vec4<u32>, j: u32) -> vec2<f32> {
    let s = array<u32, 3>(h.y, h.z, h.w);
    let byte = (j % 4u) * 8u;
    if (j < 4u) {
        return vec2<f32>(f32((s[0] >> byte) & 63u), f32((s[1] >> byte) & 63u));
    }
    let x = (s[2] >> byte) & 255u;
    let lo = (s[0] >> byte) & 255u;
    let mid = (s[1] >> byte) & 255u;
    return vec2<f32>(f32((x & 15u) | ((lo >> 6u) << 4u)), f32((x >> 4u) | ((mid >> 6u) << 4u)));
}

fn q8_tile_product(lid: u32) -> Q8Acc {
    let tx = lid % TX;
    let ty = lid / TX;
    // W jobs: row jr, half jh (words 4 jh .. 4 jh + 3 of the chunk); half 0 also decodes the scales
    let has_w = lid < 2u * BM;
    let jr = lid % BM;
    let jh = lid / BM;
    let wrow = q8_w_row(jr);
    // X jobs: token xt, quarter xc (words 4 xc .. 4 xc + 3 of its 64 codes); quarter 0 also the scales
    let has_x = lid < 4u * BN;
    let xt = lid % BN;
    let xc = lid / BN;
    let xrow = q8_x_row(xt);

    var head = vec4<u32>(0u);            // the block's d, dmin and scales (the 16 bytes before qs)
    var codes = vec4<u32>(0u);
    var xq = vec4<u32>(0u);
    var xsc = vec4<f32>(0.0);            // (d, sum) of the chunk's two activation blocks
    if (has_w) {
        head = W[wrow];
        codes = W[wrow + 1u + jh];
    }
    if (has_x) {
        xq = XQ[xrow * (K / 16u) + xc];
        xsc = XS[xrow * (K / 64u)];
    }
    var acc = mat4x4<f32>();             // acc[i][j]: row 4 tx + i, token 4 ty + j
    var acc2 = mat4x4<f32>();            // row 4 (tx + TX) + i (TM = 8)
    for (var k0 = 0u; k0 < K; k0 += 64u) {
        if (has_w) {
            for (var m = 0u; m < 4u; m++) {
                let lo = codes[m] & 0x0f0f0f0fu;
                let hi = (codes[m] >> 4u) & 0x0f0f0f0fu;
                ws[(4u * jh + m) * GM + jr / 4u][jr % 4u] = lo;
                ws[(8u + 4u * jh + m) * GM + jr / 4u][jr % 4u] = hi;
            }
            if (jh == 0u) {
                let dm = unpack2x16float(head.x);
                let c = (k0 % 256u) / 64u;
                let s0 = scale_min(head, 2u * c);
                let s1 = scale_min(head, 2u * c + 1u);
                wa[jr / 4u][jr % 4u] = dm.x * s0.x;
                wb[jr / 4u][jr % 4u] = dm.y * s0.y;
                wa[GM + jr / 4u][jr % 4u] = dm.x * s1.x;
                wb[GM + jr / 4u][jr % 4u] = dm.y * s1.y;
            }
        }
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
        if (k1 < K) {
            if (has_w) {
                let blk = wrow + (k1 / 256u) * 9u;
                head = W[blk];
                codes = W[blk + 1u + 2u * ((k1 % 256u) / 64u) + jh];
            }
            if (has_x) {
                xq = XQ[xrow * (K / 16u) + k1 / 16u + xc];
                xsc = XS[xrow * (K / 64u) + k1 / 64u];
            }
        }
        for (var s = 0u; s < 2u; s++) {
            var i0 = vec4<i32>(0);
            var i1 = vec4<i32>(0);
            var i2 = vec4<i32>(0);
            var i3 = vec4<i32>(0);
            var i4 = vec4<i32>(0);
            var i5 = vec4<i32>(0);
            var i6 = vec4<i32>(0);
            var i7 = vec4<i32>(0);
            for (var kk = 8u * s; kk < 8u * s + 8u; kk++) {
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
            let a = wa[s * GM + tx];
            let b = wb[s * GM + tx];
            let d = xd[s * GN + ty];
            let m = xm[s * GN + ty];
            acc[0] += vec4<f32>(i0) * (a.x * d) - b.x * m;
            acc[1] += vec4<f32>(i1) * (a.y * d) - b.y * m;
            acc[2] += vec4<f32>(i2) * (a.z * d) - b.z * m;
            acc[3] += vec4<f32>(i3) * (a.w * d) - b.w * m;
            if (TM == 8u) {
                let a2 = wa[s * GM + tx + TX];
                let b2 = wb[s * GM + tx + TX];
                acc2[0] += vec4<f32>(i4) * (a2.x * d) - b2.x * m;
                acc2[1] += vec4<f32>(i5) * (a2.y * d) - b2.y * m;
                acc2[2] += vec4<f32>(i6) * (a2.z * d) - b2.z * m;
                acc2[3] += vec4<f32>(i7) * (a2.w * d) - b2.w * m;
            }
        }
        workgroupBarrier();
    }
    return Q8Acc(acc, acc2);
}
