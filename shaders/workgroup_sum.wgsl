// workgroup_sum(lid, v) / workgroup_max(lid, v): the sum / the max of v over the WG threads of a
// workgroup, returned to every thread (a tree in shared memory). The including kernel declares `override WG: u32` (a power
// of two, the workgroup size) and calls this in uniform control flow (it holds barriers).

var<workgroup> wg_red: array<f32, WG>;

fn workgroup_sum(lid: u32, v: f32) -> f32 {
    wg_red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) { wg_red[lid] += wg_red[lid + s]; }
        workgroupBarrier();
    }
    let total = wg_red[0];
    workgroupBarrier();                      // everyone has read wg_red[0] before wg_red is reused
    return total;
}

fn workgroup_max(lid: u32, v: f32) -> f32 {
    wg_red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) { wg_red[lid] = max(wg_red[lid], wg_red[lid + s]); }
        workgroupBarrier();
    }
    let m = wg_red[0];
    workgroupBarrier();
    return m;
}
