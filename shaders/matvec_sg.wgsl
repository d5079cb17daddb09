// Decode matvec with subgroup reductions: same contract and dispatch as matvec.wgsl
// (y = W x, W quantized, K/N/TPR/WG overrides), for devices with the `subgroups`
// feature. Each subgroup sums with subgroupAdd; lane 0 of each subgroup leaves its
// partial in shared memory and the row's first thread adds the TPR / sg partials.
// Assumes subgroups are runs of consecutive local_invocation_index (true of every
// driver we know); a subgroup wider than TPR falls back to the shared-memory tree.

override K: u32;
override N: u32;
override TPR: u32 = 64u;
override WG: u32 = 256u;

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;

var<workgroup> red: array<f32, WG>;

//!include quants

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32, @builtin(subgroup_size) sg: u32,
        @builtin(subgroup_invocation_id) lane: u32) {
    let row = (wid.x + wid.y * nwg.x) * (WG / TPR) + lid / TPR;
    let t = lid % TPR;
    let gpb = QK / 4u;
    let rowbase = min(row, N - 1u) * (K / QK) * QB;
    var acc = 0.0;
    for (var g = t; g < K / 4u; g += TPR) {
        acc += dot(dq4(rowbase + (g / gpb) * QB, g % gpb), X[g]);
    }
    if (sg <= TPR) {
        let s = subgroupAdd(acc);
        if (lane == 0u) { red[lid] = s; }
        workgroupBarrier();
        if (t == 0u && row < N) {
            var tot = 0.0;
            for (var k = 0u; k < TPR; k += sg) { tot += red[lid + k]; }
            Y[row] = tot;
        }
    } else {
        red[lid] = acc;
        workgroupBarrier();
        for (var s = TPR / 2u; s > 0u; s >>= 1u) {
            if (t < s) { red[lid] += red[lid + s]; }
            workgroupBarrier();
        }
        if (t == 0u && row < N) { Y[row] = red[lid]; }
    }
}
