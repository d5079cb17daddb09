// matvec_tokens on activations rounded to int8 for the 32-weight unit types (Q4_0, Q5_0, Q8_0: unit8_b32.wgsl;
// Q6_K: unit8_q6k.wgsl, the prelude picks one): Y[t, r] = sum_k W[r, k] * X[t, k] for t < S.n_tokens <= MAXM,
// X as quantize_q8.wgsl left it (XQ: the codes, XS: each block's (d, exact sum)).
//
// Thread t of a row takes units t, t + TPR, ...; a unit's codes are cut once (unit8), then meet each
// token's 32 codes in 8 dot4I8Packed: two 16-byte loads of codes and one of the block's (d, sum) a token,
// where f32 X costs eight loads and the weights' decoding every 4 (matvec_tokens.wgsl).
// W: raw GGUF bytes [N, K] (K a multiple of 32); XQ: u32 [T, K / 4]; XS: vec2 [T, K / 32]; Y: f32 [T, LDY]
// (LDY 0: N). MAXM from the prelude. Dispatch: ceil(N / (WG / TPR)) workgroups, split into (x, y) above 65535.

override K: u32;
override N: u32;
override LDY: u32 = 0u;
override TPR: u32 = 32u;
override WG: u32 = 128u;

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> XQ: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> XS: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read_write> Y: array<f32>;
@group(0) @binding(4) var<uniform> S: Step;

// A unit's codes as int8 four to a word in dot4I8Packed's order (lo: weights 0-15, hi: 16-31) with
// w = scale.x lo (scale.y hi) - offset.
struct Unit8 {
    lo: vec4<u32>,
    hi: vec4<u32>,
    scale: vec2<f32>,
    offset: f32,
}

//!include quants
//!include dot16_i8
//!include row_sums
//!include tokens_out

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let m_rows = min(S.n_tokens, MAXM);
    let row = (wid.x + wid.y * nwg.x) * (WG / TPR) + lid / TPR;
    let t = lid % TPR;
    let qrow = K / 16u;            // XQ vec4s a token
    let units = K / 32u;           // XS blocks a token
    var acc: array<f32, MAXM>;
    if (row < N) {
        let rb = row * (K / QK) * QB;
        for (var u = t; u < units; u += TPR) {
            let c = unit8(rb, u);
            for (var m = 0u; m < MAXM; m++) {
                if (m >= m_rows) { break; }                 // uniform: every thread has the same m_rows
                let xl = XQ[m * qrow + 2u * u];
                let xh = XQ[m * qrow + 2u * u + 1u];
                let s = XS[m * units + u];
                acc[m] += s.x * (c.scale.x * f32(dot16_i8(c.lo, xl)) + c.scale.y * f32(dot16_i8(c.hi, xh)))
                        - c.offset * s.y;
            }
        }
    }
    sum_row_shares(lid, acc, m_rows);
    write_token_rows(lid, row, m_rows);
}
