// dx_tile: one workgroup's 64 x 64 tile of dX = dY W through a frozen W [N, K] (rows of K, any type in
// quants.wgsl, dequantized as the forward does), shared by matmul_dx.wgsl and moe_backward.wgsl `dx`.
// A tile is TILE rows of dY (tokens, or one expert's grouped slots) by TILE outputs (16 vec4 of k),
// reduced over N in steps of NS rows: each step every one of the 256 threads dequantizes one vec4 of
// W (row n0 + lid / 16, output group g0 + lid % 16) and reads 4 dY values (its load row, columns
// n0 + 4 (lid % 4)..+3); then each thread adds NS rows to its 4 tile rows (lid / 16 + 16j) x 4
// consecutive outputs (vec4 lid % 16). The includer declares K, N, LDD (dY's row stride, 0: N), COL0
// (this projection's first column of dY), W and DY, and calls dx_tile from uniform control flow (it
// holds barriers) with a workgroup of 256.

const TILE: u32 = MATMUL_TILE;   // 16 threads x 4 each way: the loops below are written for 64
const NS: u32 = 16u;             // rows of W (and of dY's columns) per step
var<workgroup> ws: array<vec4<f32>, 256>;   // [NS rows][16 vec4 of outputs]
var<workgroup> ys: array<vec4<f32>, 256>;   // [TILE rows][NS / 4 vec4 of dY's columns]

// Thread lid's sums for tile rows lid / 16 + 16j (j < 4), outputs 4 (g0 + lid % 16)..+3, over W's rows
// from byte wbase. The thread loads tile row lid / 4 from dY row y_row (zeros unless y_ok), times c.
fn dx_tile(lid: u32, g0: u32, wbase: u32, y_row: u32, y_ok: bool, c: f32) -> array<vec4<f32>, 4> {
    let kg = K / 4u;                 // vec4 groups of outputs
    let gpb = QK / 4u;
    let rb = (K / QK) * QB;          // bytes of a W row
    let ldd = select(LDD, N, LDD == 0u);
    let wgrp = g0 + lid % 16u;       // this thread's W load: row n0 + lid / 16, output group wgrp
    let tx = lid % 16u;
    let ty = lid / 16u;
    var acc = array<vec4<f32>, 4>(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
    for (var n0 = 0u; n0 < N; n0 += NS) {
        let n = n0 + lid / 16u;
        var wv = vec4<f32>(0.0);
        if (n < N && wgrp < kg) { wv = dq4(wbase + n * rb + (wgrp / gpb) * QB, wgrp % gpb); }
        ws[lid] = wv;
        var yv = vec4<f32>(0.0);
        if (y_ok) {
            let col = n0 + 4u * (lid % 4u);
            let base = y_row * ldd + COL0 + col;
            if (col < N) { yv.x = DY[base]; }
            if (col + 1u < N) { yv.y = DY[base + 1u]; }
            if (col + 2u < N) { yv.z = DY[base + 2u]; }
            if (col + 3u < N) { yv.w = DY[base + 3u]; }
        }
        ys[lid] = yv * c;
        workgroupBarrier();
        for (var s = 0u; s < NS / 4u; s++) {
            let w0 = ws[(4u * s) * 16u + tx];
            let w1 = ws[(4u * s + 1u) * 16u + tx];
            let w2 = ws[(4u * s + 2u) * 16u + tx];
            let w3 = ws[(4u * s + 3u) * 16u + tx];
            for (var j = 0u; j < 4u; j++) {
                let y = ys[(ty + 16u * j) * 4u + s];
                acc[j] += y.x * w0 + y.y * w1 + y.z * w2 + y.w * w3;
            }
        }
        workgroupBarrier();
    }
    return acc;
}
