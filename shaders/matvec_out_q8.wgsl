// A decode matvec's rows written twice: to Y, and rounded to int8 per 32 by q8_block.wgsl's rule into
// YQ / YS, in quantize_q8.wgsl's layout (codes four to a word; (d, exact sum) a block), so that the next
// matvec meets them as codes (x8_stored.wgsl) without rounding x in each of its workgroups
// (pyapp.runtime.fusion.rounded_inputs: the GeGLU output for the down projection). A workgroup's rows
// are whole blocks: (WG / TPR) % 32 == 0 and N % 32 == 0 (pyapp.gpu.kernels.matvec sees to it).

@group(0) @binding(13) var<storage, read_write> YQ: array<u32>;         // [N / 4]
@group(0) @binding(14) var<storage, read_write> YS: array<vec2<f32>>;   // [N / 32]

var<workgroup> yrows: array<f32, WG>;        // this workgroup's rows' values (the first WG / TPR)

//!include q8_block
//!include q8_gather

fn store_row(row: u32, lid: u32, y: f32) {
    Y[row] = y;
    yrows[lid / TPR] = y;
}

// Once every row is stored: 8 threads a block of 32 rows, 4 rows (a code word) each (q8_gather.wgsl).
fn round_rows(wg: u32, lid: u32) {
    workgroupBarrier();
    let blocks = WG / TPR / 32u;
    let b = lid / 8u;                        // the workgroup's block this thread rounds a word of
    let j = 4u * lid;                        // its first row: 32 b + 4 (lid % 8)
    var v = vec4<f32>(0.0);
    if (b < blocks) {
        v = vec4<f32>(yrows[j], yrows[j + 1u], yrows[j + 2u], yrows[j + 3u]);
    }
    let m = q8_gather(lid, v);
    let gb = wg * blocks + b;                // the block of Y
    if (b < blocks && 32u * gb < N) {
        let s = q8_scale(m.x);
        YQ[8u * gb + lid % 8u] = q8_word(v, s.y);
        if (lid % 8u == 0u) { YS[gb] = vec2<f32>(s.x, m.y); }
    }
}
