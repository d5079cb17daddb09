// The slices of a prefill attention tile's keys merged (attention_key_slices.wgsl, KSPLIT > 1):
// O[row] = sum_z e^(m_z - M) acc_z / sum_z e^(m_z - M) l_z (M: the largest m_z), one thread an output vec4.
// A slice that saw no key of the row (m = NEG, l = 0) weighs nothing; a step the tiles took unsplit
// (slices_now() 1) is left as they wrote it.
// Dispatch: ceil(T_max H HD / 4 / 64) workgroups (over (x, y) above 65535: thread_index.wgsl).

//!include attention_shape
//!include attention_key_slices
//!include thread_index

@group(0) @binding(0) var<storage, read> P: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> O: array<vec4<f32>>;
@group(0) @binding(2) var<uniform> S: Step;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    let hd4 = HD / 4u;
    if (i >= S.n_tokens * H * hd4 || slices_now() == 1u) { return; }
    let row = i / hd4;
    let d = i % hd4;
    var mx = NEG;
    for (var z = 0u; z < KSPLIT; z++) { mx = max(mx, P[slice_row(z, row) + hd4].x); }
    var acc = vec4<f32>(0.0);
    var l = 0.0;
    for (var z = 0u; z < KSPLIT; z++) {
        let ml = P[slice_row(z, row) + hd4];
        let a = exp(ml.x - mx);
        acc += a * P[slice_row(z, row) + d];
        l += a * ml.y;
    }
    O[i] = acc / l;
}
