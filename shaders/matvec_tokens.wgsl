// Matvec over the few tokens of a step: Y[t, r] = sum_k W[r, k] * X[t, k] for t < S.n_tokens <= MAXM.
//
// Mirrors ggml_mul_mat for a small batch (llama.cpp's mul_mat_vec with several columns): each
// weight is read once per step, as by the decode matvec, and multiplied into every token's sum
// (row_dots.wgsl), where matmul.wgsl's 64 x 64 tiles would mostly multiply padding and leave most
// of the GPU idle (N / 64 workgroups). For speculative decoding's steps of a token and its drafts.
// W: raw GGUF bytes of [N, K] (any type in quants.wgsl); X: f32 [T, K]; Y: f32 [T, LDY] (LDY 0: N;
// a row block of a split W writes its columns of a wider Y, bound at its first column).
// MAXM comes from the prelude (pyapp.gpu.kernels.FEW_TOKENS). Thread t of a row writes tokens t,
// t + TPR, ...
// Dispatch: ceil(N / (WG / TPR)) workgroups, split into (x, y) above 65535.

override K: u32;
override N: u32;
override LDY: u32 = 0u;
override TPR: u32 = 32u;
override WG: u32 = 128u;

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> S: Step;

//!include quants
//!include row_dots
//!include tokens_out

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let m_rows = min(S.n_tokens, MAXM);
    let row = (wid.x + wid.y * nwg.x) * (WG / TPR) + lid / TPR;
    row_dots(lid, min(row, N - 1u) * (K / QK) * QB, row < N, m_rows);
    write_token_rows(lid, row, m_rows);
}
