// Greedy sampling on the GPU: OUT[0] = argmax(L[0..V)), lowest index on ties,
// NaN counts as -inf. Mirrors numpy's argmax (the reference sampler at T = 0).
// One workgroup of WG threads: strided scan, then a tree reduction.
// Dispatch: 1 workgroup.

override V: u32;
override WG: u32 = 256u;

@group(0) @binding(0) var<storage, read> L: array<f32>;
@group(0) @binding(1) var<storage, read_write> OUT: array<u32>;

var<workgroup> bv: array<f32, WG>;
var<workgroup> bi: array<u32, WG>;

@compute @workgroup_size(WG)
fn argmax(@builtin(local_invocation_index) lid: u32) {
    var best = -3.4e38;
    var idx = 0xffffffffu;
    for (var i = lid; i < V; i += WG) {
        let v = L[i];
        if (v > best) { best = v; idx = i; }      // strictly greater: first index wins, NaN never
    }
    bv[lid] = best;
    bi[lid] = idx;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            let v = bv[lid + s];
            let j = bi[lid + s];
            if (v > bv[lid] || (v == bv[lid] && j < bi[lid])) { bv[lid] = v; bi[lid] = j; }
        }
        workgroupBarrier();
    }
    if (lid == 0u) { OUT[0] = select(bi[0], 0u, bi[0] == 0xffffffffu); }
}
