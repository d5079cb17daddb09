// row_sums: each row's total of its TPR threads' shares, for up to MAXM rows of X at once (a tree in
// shared memory). Shared by row_dots.wgsl and matvec_tokens_q4k.wgsl. The includer declares TPR
// (threads per row, a power of two), WG (the workgroup size) and the const MAXM, and calls
// sum_row_shares from uniform control flow (it holds barriers).

var<workgroup> sums: array<f32, MAXM * WG>;    // [m][lid]: the threads' partial dot products

// Thread lid, one of the TPR threads of its row, adds its shares acc[m] (m < m_rows, the same for
// every thread) into the row's: afterwards sums[m * WG + lid0] holds the row's total with X[m] (lid0:
// the row's first thread).
fn sum_row_shares(lid: u32, acc: array<f32, MAXM>, m_rows: u32) {
    let t = lid % TPR;
    for (var m = 0u; m < MAXM; m++) {
        if (m >= m_rows) { break; }
        sums[m * WG + lid] = acc[m];
    }
    workgroupBarrier();
    for (var s = TPR / 2u; s > 0u; s >>= 1u) {
        if (t < s) {
            for (var m = 0u; m < MAXM; m++) {
                if (m >= m_rows) { break; }
                sums[m * WG + lid] += sums[m * WG + lid + s];
            }
        }
        workgroupBarrier();
    }
}
