// Backward of the mixture-of-experts block (moe.wgsl, moe_grouped.wgsl), for the training backward.
//
// Mirrors pyapp.reference.backward.experts_backward and router_weights_backward, for the slots
// s = t*KSEL + j of the step's T = S.n_tokens tokens: expert e = IDS[s], weight WTS[s] (the router's
// renormalized probability), per-expert down scale SC[e] (1 without HAS_SC). The expert weights are
// frozen and stay GGUF-encoded: dequantized in the kernel as the forward does.
//
//   router:   DLOG[t, :E] = router_weights_backward(softmax(LOG[t]), IDS[t], dw[t]), where
//             dw[t, j] = DO[t] . YE[s] * SC[e] is dloss/dWTS[s] (DO [T, D]: dloss/d(the weighted sum);
//             YE [T*KSEL, D]: the experts' outputs before weighting and scale, kept by the forward).
//             The top-k choice is piecewise constant: no gradient through it. One workgroup of WG
//             threads per token. Dispatch (T).
//   dx:       a grouped matmul_dx: DX[s, k] (+)= c(s) * sum_n DY[yrow(s), COL0 + n] * W[e, n, k] for W
//             [E, N, K] (rows of K), DY rows of LDD floats (0: N), yrow = t (YPER = 1: one row a token,
//             the down projection's dout) or s (YPER = KSEL: one a slot, the gate/up gradients), c(s) =
//             WTS[s] * SC[e] with SCALED (dmid = down_e^T (w * scale * dout)), else 1; DX [T*KSEL, K], one
//             row a slot (a token's slots are summed by slot_sum). The slots come grouped by expert
//             (moe_grouped.wgsl's `group`: GRP, the forward's grouping of the same ids), and the tiles
//             are matmul_dx.wgsl's (64 outputs x 64 grouped slots a workgroup, NS rows of W a step), so
//             each expert's weights are read once per 64 of its slots. A tile finds its expert as
//             moe_grouped's matmul does; W holds experts E0 .. E0 + NE - 1 (a split tensor: one
//             dispatch per buffer, each writing its experts' slots). Dispatch (ceil(K / 64),
//             ceil(T*KSEL / 64) + min(E, T*KSEL)); tiles past the last return at once.
//   slot_sum: OUT[t, d] = sum_j YS[t*KSEL + j, d]: the per-slot input gradients summed per token.
//             A thread per output. Dispatch ceil(T*D / 64) (split above 65535).

override E: u32 = 1u;
override KSEL: u32 = 1u;
override K: u32 = 4u;
override N: u32 = 1u;
override D: u32 = 1u;
override LDD: u32 = 0u;
override COL0: u32 = 0u;
override YPER: u32 = 1u;
override SCALED: bool = false;
override HAS_SC: bool = false;
override ACC: bool = false;
override E0: u32 = 0u;
override NE: u32 = 1u;
override WG: u32 = 64u;

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> DY: array<f32>;
@group(0) @binding(2) var<storage, read_write> DX: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> S: Step;
@group(0) @binding(4) var<storage, read> GRP: array<u32>;
@group(0) @binding(5) var<storage, read> WTS: array<f32>;
@group(0) @binding(6) var<storage, read> SC: array<f32>;
@group(0) @binding(7) var<storage, read> LOG: array<f32>;
@group(0) @binding(8) var<storage, read> IDS: array<u32>;
@group(0) @binding(9) var<storage, read> DO: array<f32>;
@group(0) @binding(10) var<storage, read> YE: array<f32>;
@group(0) @binding(11) var<storage, read_write> DLOG: array<f32>;
@group(0) @binding(12) var<storage, read> YS: array<f32>;
@group(0) @binding(13) var<storage, read_write> OUT: array<f32>;

//!include quants
//!include workgroup_reduce

// -- router ---------------------------------------------------------------------------------------------

var<workgroup> dw: array<f32, KSEL>;

@compute @workgroup_size(WG)
fn router(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.x;
    if (t >= S.n_tokens) { return; }      // uniform per workgroup: barriers stay legal
    // dw[j] = dloss/dweight of slot j
    for (var j = 0u; j < KSEL; j++) {
        let s = t * KSEL + j;
        var acc = 0.0;
        for (var d = lid; d < D; d += WG) { acc += DO[t * D + d] * YE[s * D + d]; }
        red[lid] = acc;
        let v = reduce(lid, false);
        if (lid == 0u) {
            dw[j] = v;
            if (HAS_SC) { dw[j] = v * SC[IDS[s]]; }
        }
    }
    // the softmax over all experts
    var m = -3.4e38;
    for (var e = lid; e < E; e += WG) { m = max(m, LOG[t * E + e]); }
    red[lid] = m;
    m = reduce(lid, true);                 // its barriers also publish dw
    var z = 0.0;
    for (var e = lid; e < E; e += WG) { z += exp(LOG[t * E + e] - m); }
    red[lid] = z;
    z = reduce(lid, false);
    // w_j = p_j / sum(p_chosen): dchosen_j = (dw_j - sum_i dw_i w_i) / sum(p_chosen)
    var total = 0.0;
    var dot_w = 0.0;
    for (var j = 0u; j < KSEL; j++) {
        let p = exp(LOG[t * E + IDS[t * KSEL + j]] - m) / z;
        total += p;
        dot_w += dw[j] * p;
    }
    dot_w /= total;
    // softmax_backward: dlogit_e = p_e (dprob_e - sum_i dprob_i p_i), dprob nonzero on the chosen only
    var dot_p = 0.0;
    for (var j = 0u; j < KSEL; j++) {
        dot_p += (dw[j] - dot_w) / total * exp(LOG[t * E + IDS[t * KSEL + j]] - m) / z;
    }
    for (var e = lid; e < E; e += WG) {
        var dp = 0.0;
        for (var j = 0u; j < KSEL; j++) {
            if (IDS[t * KSEL + j] == e) { dp = (dw[j] - dot_w) / total; }
        }
        DLOG[t * E + e] = exp(LOG[t * E + e] - m) / z * (dp - dot_p);
    }
}

// -- dx: grouped matmul_dx -------------------------------------------------------------------------------

const TILE: u32 = MATMUL_TILE;   // 16 threads x 4 each way: the loops below are written for 64
const NS: u32 = 16u;             // rows of W (and of dY's columns) per step
var<workgroup> ws: array<vec4<f32>, 256>;   // [NS rows][16 vec4 of outputs]
var<workgroup> ys: array<vec4<f32>, 256>;   // [TILE grouped slots][NS / 4 vec4 of rows]
var<workgroup> slot_at: array<u32, TILE>;    // the slot of each grouped row of the tile
var<workgroup> tile_expert: u32;

@compute @workgroup_size(256)
fn dx(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let tile = wid.y;
    if (lid == 0u) {          // the last expert whose first tile is <= tile (as moe_grouped's matmul)
        var lo = 0u;
        var hi = E - 1u;
        while (lo < hi) {
            let mid = (lo + hi + 1u) / 2u;
            if (GRP[E + 1u + mid] <= tile) { lo = mid; } else { hi = mid - 1u; }
        }
        tile_expert = select(lo, E, tile >= GRP[2u * E + 1u]);
    }
    let e = workgroupUniformLoad(&tile_expert);
    if (e >= E || e < E0 || e >= E0 + NE) { return; }
    let row0 = GRP[e] + (tile - GRP[E + 1u + e]) * TILE;
    let rows = min(TILE, GRP[e + 1u] - row0);
    if (lid < TILE) { slot_at[lid] = select(0u, GRP[2u * E + 2u + row0 + lid], lid < rows); }
    workgroupBarrier();

    let kg = K / 4u;                 // vec4 groups of outputs
    let gpb = QK / 4u;
    let rb = (K / QK) * QB;          // bytes of a W row
    let ebase = (e - E0) * N * rb;   // the expert's first row
    let ldd = select(LDD, N, LDD == 0u);
    let g0 = wid.x * 16u;            // the tile's first output group
    let wgrp = g0 + lid % 16u;       // this thread's W load: row n0 + lid / 16, output group wgrp
    let yi = lid / 4u;               // this thread's dY load: grouped row yi, rows n0 + 4 (lid % 4) ..+3
    let y_ok = yi < rows;
    let ys_slot = slot_at[yi];
    let yrow = select(ys_slot / KSEL, ys_slot, YPER > 1u);
    var c = 1.0;
    if (SCALED && y_ok) {
        c = WTS[ys_slot];
        if (HAS_SC) { c *= SC[e]; }
    }
    let tx = lid % 16u;
    let ty = lid / 16u;
    var acc = array<vec4<f32>, 4>(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
    for (var n0 = 0u; n0 < N; n0 += NS) {
        let n = n0 + lid / 16u;
        var wv = vec4<f32>(0.0);
        if (n < N && wgrp < kg) { wv = dq4(ebase + n * rb + (wgrp / gpb) * QB, wgrp % gpb); }
        ws[lid] = wv;
        var yv = vec4<f32>(0.0);
        if (y_ok) {
            let col = n0 + 4u * (lid % 4u);
            let base = yrow * ldd + COL0 + col;
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
    let g = g0 + tx;
    if (g < kg) {
        for (var j = 0u; j < 4u; j++) {
            let i = ty + 16u * j;
            if (i < rows) {
                let o = slot_at[i] * kg + g;
                if (ACC) { DX[o] = DX[o] + acc[j]; } else { DX[o] = acc[j]; }
            }
        }
    }
}

// -- slot_sum ---------------------------------------------------------------------------------------------

@compute @workgroup_size(64)
fn slot_sum(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if (i >= S.n_tokens * D) { return; }
    let t = i / D;
    let d = i % D;
    var acc = 0.0;
    for (var j = 0u; j < KSEL; j++) { acc += YS[(t * KSEL + j) * D + d]; }
    OUT[i] = acc;
}
