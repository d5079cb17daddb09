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
//             [E, N, K] (rows of K), DY rows of LDD floats (0: N), yrow = t (XPER = 1: one row a token,
//             the down projection's dout) or s (XPER = KSEL: one a slot, the gate/up gradients; DY is
//             this product's input, so it takes moe_tiles.wgsl's name), c(s) =
//             WTS[s] * SC[e] with SCALED (dmid = down_e^T (w * scale * dout)), else 1; DX [T*KSEL, K], one
//             row a slot (a token's slots are summed by slot_sum). The slots come grouped by expert
//             (moe_grouped.wgsl's `group`: GRP, the forward's grouping of the same ids), and the tiles
//             are matmul_dx.wgsl's (dx_tile.wgsl: 64 outputs x 64 grouped slots a workgroup), so
//             each expert's weights are read once per 64 of its slots. A tile finds its expert and
//             slots as moe_grouped's matmul does (moe_tiles.wgsl); W holds experts E0 .. E0 + NE - 1 (a split tensor: one
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
override XPER: u32 = 1u;
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

//!include dx_tile
const BN: u32 = TILE;            // moe_tiles.wgsl's grouped slots a tile
const NT: u32 = 256u;            // and threads a workgroup
//!include moe_tiles

@compute @workgroup_size(256)
fn dx(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let e = tile_slots(wid.y, lid);
    if (e >= E || e < E0 || e >= E0 + NE) { return; }
    let yi = lid / 4u;               // the grouped row whose dY row this thread loads
    let y_ok = yi < slot_rows;
    var c = 1.0;
    if (SCALED && y_ok) {
        c = WTS[slot_at[yi]];
        if (HAS_SC) { c *= SC[e]; }
    }
    let g0 = wid.x * 16u;            // the tile's first output group
    let acc = dx_tile(lid, g0, (e - E0) * N * (K / QK) * QB, slot_x_row(yi), y_ok, c);
    let kg = K / 4u;
    let g = g0 + lid % 16u;
    if (g < kg) {
        for (var j = 0u; j < 4u; j++) {
            let i = lid / 16u + 16u * j;
            if (i < slot_rows) {
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
