// Decode matvec for Q4_K in 16-byte chunks (matvec_q4k_common.wgsl), rows summed with a tree in
// shared memory. Dispatch: ceil(N / (WG / TPR)) workgroups, split into (x, y) above 65535.

//!include matvec_q4k_common

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = (wid.x + wid.y * nwg.x) * (WG / TPR) + lid / TPR;
    let t = lid % TPR;
    if (tail_workgroup(wid.x + wid.y * nwg.x, lid)) { return; }
    input_prologue(lid, wid.x + wid.y == 0u);
    x_prepare(lid);
    let total = row_tree_sum(lid, t, row_partials(row, t));
    if (t == 0u && row < N) { store_row(row, lid, finish(row, total.x, total.y)); }
    round_rows(wid.x + wid.y * nwg.x, lid);
}
