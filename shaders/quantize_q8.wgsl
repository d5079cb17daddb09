// Activations to int8 for the int8 prefill matmul (matmul_q8.wgsl): each row of X (f32 [T, K])
// in blocks of 32, as llama.cpp's quantize_q8_1 does for its MMQ kernels:
//   d = max |x| / 127,  q = round(x / d) in -127..127 (0 where the block is all zero)
// XQ (u32 [T, K / 4]): the q, four to a word, byte i of word w = element 4 w + i (dot4I8Packed's order).
// XS (vec2 [T, K / 32]): per block (d, sum of the block's x): the sum is exact, not d * sum(q),
// so a Q4_K sub-block's min term (min * sum x) carries no activation rounding.
// One thread per block; K (a multiple of 32) is an override constant; the rows are the step's
// n_tokens times RPT (the MoE's per-slot inputs: KSEL rows a token).

override K: u32;
override RPT: u32 = 1u;

@group(0) @binding(0) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> XQ: array<u32>;
@group(0) @binding(2) var<storage, read_write> XS: array<vec2<f32>>;
@group(0) @binding(3) var<uniform> S: Step;

//!include q8_block

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) ng: vec3<u32>) {
    let b = gid.x + gid.y * ng.x * 64u;          // block: token b / (K / 32), block b % (K / 32)
    if (b >= S.n_tokens * RPT * (K / 32u)) { return; }
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) { v[i] = X[8u * b + i]; }
    let r = q8_block(v);
    for (var i = 0u; i < 8u; i++) { XQ[8u * b + i] = r.q[i]; }
    XS[b] = r.ds;
}
