// row_dots: one weight row's dot products with up to MAXM rows of X at once, the row read once.
// Shared by head_argmax.wgsl and matvec_tokens.wgsl. The includer declares K, TPR (threads per
// row, a power of two), WG (the workgroup size), W (read through the quants prelude's dq4), X:
// array<vec4<f32>> [MAXM, K] and the const MAXM, and calls row_dots from uniform control flow (it
// holds barriers). The per-X-row accumulators are a private array of constant size MAXM, looped
// over with constant bounds, so they can live in registers.

//!include row_sums

// Thread lid, one of the TPR threads of its row, adds up its share of W row `rowbase` (bytes; when
// row_ok) . X[m] for m < m_rows, striding over 4-weight groups; the shares are then summed in shared
// memory: afterwards sums[m * WG + lid0] holds the row's dot with X[m] (lid0: the row's first thread).
fn row_dots(lid: u32, rowbase: u32, row_ok: bool, m_rows: u32) {
    let t = lid % TPR;
    var acc: array<f32, MAXM>;
    if (row_ok) {
        let gpb = QK / 4u;
        let kg = K / 4u;
        for (var g = t; g < kg; g += TPR) {
            let wv = dq4(rowbase + (g / gpb) * QB, g % gpb);
            for (var m = 0u; m < MAXM; m++) {
                if (m >= m_rows) { break; }          // uniform: every thread has the same m_rows
                acc[m] += dot(wv, X[m * kg + g]);
            }
        }
    }
    sum_row_shares(lid, acc, m_rows);
}
