// Decode matvec: y[r] = sum_k W[r, k] * x[k], W quantized (any type in quants.wgsl).
//
// Mirrors ggml_mul_mat for a single token (llama.cpp's mul_mat_vec kernels).
// W: raw GGUF bytes of a [N, K] tensor (ne0 = K contiguous; row r starts at byte
//    r * (K / QK) * QB). X: K floats as vec4. Y: N floats.
// K (multiple of QK) and N are override constants: the plan is built per shape.
// A workgroup of WG threads handles WG / TPR rows, TPR threads per row, each
// thread striding over 4-weight groups; then a tree reduction in shared memory.
// Dispatch: ceil(N / (WG / TPR)) workgroups, split into (x, y) above 65535.

//!include matvec_common

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = (wid.x + wid.y * nwg.x) * (WG / TPR) + lid / TPR;
    let t = lid % TPR;
    if (tail_workgroup(wid.x + wid.y * nwg.x, lid)) { return; }
    input_prologue(lid, wid.x + wid.y == 0u);
    x_prepare(lid);
    reduce_and_finish(lid, t, row, row_partials(row, t));
    round_rows(wid.x + wid.y * nwg.x, lid);
}
