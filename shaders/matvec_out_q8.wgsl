// A decode matvec's rows written twice: to Y, and rounded to int8 per 32 by q8_block.wgsl's rule into
// YQ / YS, in quantize_q8.wgsl's layout (codes four to a word; (d, exact sum) a block), so that the next
// matvec meets them as codes (x8_stored.wgsl) without rounding x in each of its workgroups
// (pyapp.runtime.fusion.rounded_inputs: the GeGLU output for the down projection). A workgroup's rows
// are whole blocks: (WG / TPR) % 32 == 0 and N % 32 == 0 (pyapp.gpu.kernels.matvec sees to it).

@group(0) @binding(13) var<storage, read_write> YQ: array<vec4<u32>>;   // [N / 16]
@group(0) @binding(14) var<storage, read_write> YS: array<vec2<f32>>;   // [N / 32]

var<workgroup> yrows: array<f32, WG>;        // this workgroup's rows' values (the first WG / TPR)

//!include q8_block

fn store_row(row: u32, lid: u32, y: f32) {
    Y[row] = y;
    yrows[lid / TPR] = y;
}

// One thread a block of 32 rows rounds it, once every row is stored.
fn round_rows(wg: u32, lid: u32) {
    workgroupBarrier();
    let blocks = WG / TPR / 32u;
    let b = wg * blocks + lid;               // the block of Y this thread rounds
    if (lid < blocks && 32u * b < N) {
        var v: array<vec4<f32>, 8>;
        for (var i = 0u; i < 8u; i++) {
            let j = 32u * lid + 4u * i;
            v[i] = vec4<f32>(yrows[j], yrows[j + 1u], yrows[j + 2u], yrows[j + 3u]);
        }
        let r = q8_block(v);
        YQ[2u * b] = vec4<u32>(r.q[0], r.q[1], r.q[2], r.q[3]);
        YQ[2u * b + 1u] = vec4<u32>(r.q[4], r.q[5], r.q[6], r.q[7]);
        YS[b] = r.ds;
    }
}
