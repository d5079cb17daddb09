// reduce(lid, is_max): the max (is_max) or the sum of red[0..WG), which each of the workgroup's WG
// threads has filled at red[lid], returned to every thread (a tree in shared memory; its barriers
// also publish any other shared writes made before the call). The including kernel declares
// `override WG: u32` (a power of two, the workgroup size) and calls this in uniform control flow.

var<workgroup> red: array<f32, WG>;

fn reduce(lid: u32, is_max: bool) -> f32 {
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red[lid] = select(red[lid] + red[lid + s], max(red[lid], red[lid + s]), is_max);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}
