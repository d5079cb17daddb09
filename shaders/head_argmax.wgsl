// Greedy verification head (speculative decoding): the id of the largest softcapped logit of each of
// the last step's M rows, without the [M, vocab] logits ever being written.
//
// Mirrors reference forward's tail for every row, then numpy's argmax per row (lowest id on ties,
// NaN never chosen): argmax(softcap(X @ W^T)) with X = the M rows after the final norm.
// X: f32 [M, K] (M = S.n_tokens, at most MAXM); W: raw GGUF bytes of one row block of the output
// matrix, vocabulary ids R0 .. R0 + N - 1 (a head split over bindings runs `rows` once per block).
// MAXM comes from the prelude (pyapp.gpu.kernels.HEAD_ROWS).
//   rows:   workgroup w scores WG / TPR vocabulary rows (row_dots.wgsl: TPR threads a row, each
//           weight read once for all X rows), and keeps per X row the best of its vocabulary rows
//           in P[m * NP + P0 + w] = (value bits, id). Dispatch: ceil(N / (WG / TPR)) workgroups,
//           split into (x, y) above 65535; P0: the workgroups of earlier blocks.
//   reduce: OUT[OUT0 + m] = the id of the best of the NP partials of row m. Dispatch: MAXM
//           workgroups (those past S.n_tokens return at once).

override K: u32 = 4u;
override N: u32 = 1u;
override R0: u32 = 0u;           // first vocabulary id of this block
override P0: u32 = 0u;           // first partial of this block (per X row)
override NP: u32 = 1u;           // partials per X row, over every block
override TPR: u32 = 32u;         // threads per vocabulary row, power of two, <= WG
override WG: u32 = 128u;
override CAP: f32 = 0.0;         // final logit softcap (0: none)
override OUT0: u32 = 0u;         // OUT index of row 0

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> P: array<vec2<u32>>;
@group(0) @binding(3) var<uniform> S: Step;
@group(0) @binding(4) var<storage, read_write> OUT: array<u32>;

//!include quants
//!include gelu
//!include row_dots

const NO_ID: u32 = 0xffffffffu;

@compute @workgroup_size(WG)
fn rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let m_rows = min(S.n_tokens, MAXM);
    let w = wid.x + wid.y * nwg.x;
    let per_group = WG / TPR;
    let r = w * per_group + lid / TPR;     // vocabulary row of this block
    row_dots(lid, min(r, N - 1u) * (K / QK) * QB, r < N, m_rows);
    // thread m: the best vocabulary row of this workgroup for X row m (rows in id order, strictly
    // greater wins: the lowest id on ties; NaN is never greater)
    if (lid < m_rows) {
        var best = -3.4e38;
        var id = NO_ID;
        for (var j = 0u; j < per_group; j++) {
            let rr = w * per_group + j;
            if (rr < N) {
                var v = sums[lid * WG + j * TPR];
                if (CAP > 0.0) { v = tanh_safe(v / CAP) * CAP; }
                if (v > best) { best = v; id = R0 + rr; }
            }
        }
        P[lid * NP + P0 + w] = vec2<u32>(bitcast<u32>(best), id);
    }
}

var<workgroup> best_v: array<f32, 256>;
var<workgroup> best_i: array<u32, 256>;

@compute @workgroup_size(256)
fn reduce(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let m = wid.x;
    if (m >= min(S.n_tokens, MAXM)) { return; }     // uniform per workgroup: barriers stay legal
    var best = -3.4e38;
    var id = NO_ID;
    for (var i = lid; i < NP; i += 256u) {
        let p = P[m * NP + i];
        let v = bitcast<f32>(p.x);
        if (p.y != NO_ID && (v > best || (v == best && p.y < id))) { best = v; id = p.y; }
    }
    best_v[lid] = best;
    best_i[lid] = id;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (lid < s) {
            let v = best_v[lid + s];
            let j = best_i[lid + s];
            if (j != NO_ID && (v > best_v[lid] || (v == best_v[lid] && j < best_i[lid]))) {
                best_v[lid] = v;
                best_i[lid] = j;
            }
        }
        workgroupBarrier();
    }
    if (lid == 0u) { OUT[OUT0 + m] = select(best_i[0], 0u, best_i[0] == NO_ID); }
}
