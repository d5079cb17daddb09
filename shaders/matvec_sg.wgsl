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
    let rowbase = min(row, N - 1u) * (K / QK) * QB;
    let rowbase2 = rowbase + N * (K / QK) * QB;       // MODE 1: the up half, N rows further
    let acc = partial_dot(rowbase, t);
    var acc2 = 0.0;
    if (MODE == 1u) { acc2 = partial_dot(rowbase2, t); }
    if (sg <= TPR) {
        let s = subgroupAdd(acc);
        let s2 = subgroupAdd(acc2);
        if (lane == 0u) {
            red[lid] = s;
            red2[lid] = s2;
        }
        workgroupBarrier();
        if (t == 0u && row < N) {
            var tot = 0.0;
            var tot2 = 0.0;
            for (var k = 0u; k < TPR; k += sg) {
                tot += red[lid + k];
                tot2 += red2[lid + k];
            }
            Y[row] = finish(row, tot, tot2);
        }
    } else {
        red[lid] = acc;
        red2[lid] = acc2;
        workgroupBarrier();
        for (var s = TPR / 2u; s > 0u; s >>= 1u) {
            if (t < s) {
                red[lid] += red[lid + s];
                red2[lid] += red2[lid + s];
            }
            workgroupBarrier();
        }
        if (t == 0u && row < N) { Y[row] = finish(row, red[lid], red2[lid]); }
    }
}
