// Decode matvec with subgroup reductions: same contract and dispatch as matvec.wgsl
// (y = W x, W quantized, K/N/TPR/WG overrides), for devices with the `subgroups`
// feature. Each subgroup sums with subgroupAdd; lane 0 of each subgroup leaves its
// partial in shared memory and the row's first thread adds the TPR / sg partials.
// Assumes subgroups are runs of consecutive local_invocation_index (true of every
// driver we know); a subgroup wider than TPR falls back to the shared-memory tree.

//!include matvec_common

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32, @builtin(subgroup_size) sg: u32,
        @builtin(subgroup_invocation_id) lane: u32) {
    let row = (wid.x + wid.y * nwg.x) * (WG / TPR) + lid / TPR;
    let t = lid % TPR;
    if (tail_workgroup(wid.x + wid.y * nwg.x, lid)) { return; }
    input_prologue(lid, wid.x + wid.y == 0u);
    x_prepare(lid);
    let acc = row_partials(row, t);
    if (sg > TPR) {                          // a subgroup would span rows: the shared-memory tree
        reduce_and_finish(lid, t, row, acc);
    } else {
        let s = vec2<f32>(subgroupAdd(acc.x), subgroupAdd(acc.y));
        if (lane == 0u) {
            red[lid] = s.x;
            red2[lid] = s.y;
        }
        workgroupBarrier();
        if (t == 0u && row < N) {
            var tot = vec2<f32>(0.0);
            for (var k = 0u; k < TPR; k += sg) { tot += vec2<f32>(red[lid + k], red2[lid + k]); }
            store_row(row, lid, finish(row, tot.x, tot.y));
        }
    }
    round_rows(wid.x + wid.y * nwg.x, lid);
}
