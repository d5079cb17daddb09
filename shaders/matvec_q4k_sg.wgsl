// Decode matvec for Q4_K in 16-byte chunks (matvec_q4k_common.wgsl) for devices with the
// `subgroups` feature: a row's TPR partials are summed by a butterfly of subgroupShuffleXor, no
// shared memory and no barrier. Assumes subgroups are aligned runs of consecutive
// local_invocation_index (true of every driver we know); a subgroup narrower than TPR falls back
// to the shared-memory tree. Dispatch as matvec_q4k.wgsl.

//!include matvec_q4k_common

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32, @builtin(subgroup_size) sg: u32) {
    let row = (wid.x + wid.y * nwg.x) * (WG / TPR) + lid / TPR;
    let t = lid % TPR;
    if (tail_workgroup(wid.x + wid.y * nwg.x, lid)) { return; }
    input_prologue(lid, wid.x + wid.y == 0u);
    x_prepare(lid);
    var acc = row_partials(row, t);
    if (sg < TPR) {
        acc = row_tree_sum(lid, t, acc);
    } else {
        for (var m = TPR / 2u; m > 0u; m >>= 1u) { acc += subgroupShuffleXor(acc, m); }
    }
    if (t == 0u && row < N) { store_row(row, lid, finish(row, acc.x, acc.y)); }
    round_rows(wid.x + wid.y * nwg.x, lid);
}
