// tokens_out: the matvec_tokens kernels' last part. After row_sums.wgsl's sum_row_shares, the row's TPR
// threads write its totals: thread t tokens t, t + TPR, ... (the includer declares Y, N, LDY, TPR, WG;
// LDY 0: Y is N wide).

fn write_token_rows(lid: u32, row: u32, m_rows: u32) {
    let t = lid % TPR;
    if (row < N) {
        let ldy = select(LDY, N, LDY == 0u);
        for (var m = t; m < m_rows; m += TPR) { Y[m * ldy + row] = sums[m * WG + lid - t]; }
    }
}
