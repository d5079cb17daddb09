// Backward of a frozen projection Y = X W^T: dX[t, k] (+)= sum_n dY[t, COL0 + n] * W[n, k]   (dX = dY W)
//
// Mirrors pyapp.reference.backward.linear_backward. W is the projection's GGUF tensor [N, K] (rows of K,
// any type in quants.wgsl), dequantized in the kernel as the forward does and never copied to f32
// (QLoRA-style). dY: f32 rows of LDD floats (0: N), this projection's outputs from column COL0 (a fused
// q|k|v or gate|up output holds several; a W split into row blocks is one dispatch per block, the
// later ones with ACC). dX: f32 [T, K] (K a multiple of QK, so of 4); ACC adds into it (the residual
// and LoRA paths sum their dX). T = S.n_tokens (the per-step uniform).
// Tiles: TILE tokens x TILE outputs (k) per workgroup of 256 threads, reducing over N in steps of NS
// rows: each step every thread dequantizes one vec4 of W (row n0 + lid / 16, outputs 4 (lid % 16)..+3)
// and reads 4 dY values (token lid / 4, rows n0 + 4 (lid % 4)..+3); then each thread adds NS rows to
// its 4 tokens (ty + 16j) x 4 consecutive outputs (vec4 tx). TILE = MATMUL_TILE = 64 (kernels.py's).
// Dispatch: (ceil(K / TILE), ceil(T / TILE)).

override K: u32;
override N: u32;
override LDD: u32 = 0u;
override COL0: u32 = 0u;
override ACC: bool = false;

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> DY: array<f32>;
@group(0) @binding(2) var<storage, read_write> DX: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> S: Step;

//!include quants

const TILE: u32 = MATMUL_TILE;   // 16 threads x 4 each way: the loops below are written for 64
const NS: u32 = 16u;             // rows of W (and of dY's columns) per step
var<workgroup> ws: array<vec4<f32>, 256>;   // [NS rows][16 vec4 of outputs]
var<workgroup> ys: array<vec4<f32>, 256>;   // [TILE tokens][NS / 4 vec4 of rows]

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let T = S.n_tokens;
    let kg = K / 4u;                 // vec4 groups of outputs
    let gpb = QK / 4u;
    let rb = (K / QK) * QB;          // bytes of a W row
    let ldd = select(LDD, N, LDD == 0u);
    let g0 = wid.x * 16u;            // the tile's first output group
    let t0 = wid.y * TILE;
    let wgrp = g0 + lid % 16u;       // this thread's W load: row n0 + lid / 16, output group wgrp
    let yt = t0 + lid / 4u;          // this thread's dY load: token yt, rows n0 + 4 (lid % 4) ..+3
    let tx = lid % 16u;
    let ty = lid / 16u;
    var acc = array<vec4<f32>, 4>(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
    for (var n0 = 0u; n0 < N; n0 += NS) {
        let n = n0 + lid / 16u;
        var wv = vec4<f32>(0.0);
        if (n < N && wgrp < kg) { wv = dq4(n * rb + (wgrp / gpb) * QB, wgrp % gpb); }
        ws[lid] = wv;
        var yv = vec4<f32>(0.0);
        if (yt < T) {
            let c = n0 + 4u * (lid % 4u);
            let base = yt * ldd + COL0 + c;
            if (c < N) { yv.x = DY[base]; }
            if (c + 1u < N) { yv.y = DY[base + 1u]; }
            if (c + 2u < N) { yv.z = DY[base + 2u]; }
            if (c + 3u < N) { yv.w = DY[base + 3u]; }
        }
        ys[lid] = yv;
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
    let g = g0 + tx;
    if (g < kg) {
        for (var j = 0u; j < 4u; j++) {
            let t = t0 + ty + 16u * j;
            if (t < T) {
                let i = t * kg + g;
                if (ACC) { DX[i] = DX[i] + acc[j]; } else { DX[i] = acc[j]; }
            }
        }
    }
}
