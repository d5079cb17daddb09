// A block of 32 values held four a thread by 8 consecutive threads (the block's first at lid % 8 == 0):
// its largest magnitude and sum (q8_block.wgsl's rule: the same codes; the sum in another order), gathered
// through workgroup memory, a vec2 for each of the includer's WG threads. Call from uniform control flow
// (barriers); threads without values pass zeros.

var<workgroup> q8_parts: array<vec2<f32>, WG>;

fn q8_gather(lid: u32, v: vec4<f32>) -> vec2<f32> {
    let a = abs(v);
    q8_parts[lid] = vec2<f32>(max(max(a.x, a.y), max(a.z, a.w)), v.x + v.y + v.z + v.w);
    workgroupBarrier();
    if (lid % 8u == 0u) {
        var m = q8_parts[lid];
        for (var i = 1u; i < 8u; i++) {
            let o = q8_parts[lid + i];
            m = vec2<f32>(max(m.x, o.x), m.y + o.y);
        }
        q8_parts[lid] = m;
    }
    workgroupBarrier();
    return q8_parts[lid - lid % 8u];
}
