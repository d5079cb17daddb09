// Activations to int8 for the int8 prefill matmul (matmul_q8.wgsl): each row of X (f32 [T, K])
// in blocks of 32, as llama.cpp's quantize_q8_1 does for its MMQ kernels:
//   d = max |x| / 127,  q = round(x / d) in -127..127 (0 where the block is all zero)
// XQ (u32 [T, K / 4]): the q, four to a word, byte i of word w = element 4 w + i (dot4I8Packed's order).
// XS (vec2 [T, K / 32]): per block (d, sum of the block's x): the sum is exact, not d * sum(q),
// so a Q4_K sub-block's min term (min * sum x) carries no activation rounding.
// GEGLU: X is a fused [gate | up] projection's output (f32 [T, 2 K]) and the rounded values are
// gelu_tanh(gate) * up (elementwise.wgsl's geglu_halves, fused: the down projection's input), also
// written as f32 to O where KEEP (a LoRA delta on the down projection reads them).
// Eight threads a block, a word of four values each (reads of X coalesced), 8 blocks a workgroup; the
// block's largest magnitude and sum gathered by q8_gather.wgsl (q8_block.wgsl's q8_scale and q8_word:
// every int8 path rounds alike). K (a multiple of 32) is an override constant; the rows are
// the step's n_tokens times RPT (the MoE's per-slot inputs: KSEL rows a token).

override K: u32;
override RPT: u32 = 1u;
override GEGLU: bool = false;
override KEEP: bool = false;

@group(0) @binding(0) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> XQ: array<u32>;
@group(0) @binding(2) var<storage, read_write> XS: array<vec2<f32>>;
@group(0) @binding(3) var<uniform> S: Step;
@group(0) @binding(4) var<storage, read_write> O: array<vec4<f32>>;

//!include q8_block
//!include q8_gather
//!include gelu

const WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) ng: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let b = 8u * (wid.x + wid.y * ng.x) + lid / 8u;  // block: row b / (K / 32), block b % (K / 32)
    let w = 8u * b + lid % 8u;                       // this thread's word of XQ (vec4 of X's rows of K)
    let here = b < S.n_tokens * RPT * (K / 32u);
    var v = vec4<f32>(0.0);
    if (here) {
        if (GEGLU) {
            let row = w / (K / 4u);
            let at = 2u * row * (K / 4u) + w % (K / 4u);
            let g = X[at];
            v = vec4<f32>(gelu_tanh(g.x), gelu_tanh(g.y), gelu_tanh(g.z), gelu_tanh(g.w)) * X[at + K / 4u];
            if (KEEP) { O[w] = v; }
        } else {
            v = X[w];
        }
    }
    let m = q8_gather(lid, v);
    if (here) {
        let s = q8_scale(m.x);
        XQ[w] = q8_word(v, s.y);
        if (lid % 8u == 0u) { XS[b] = vec2<f32>(s.x, m.y); }
    }
}
