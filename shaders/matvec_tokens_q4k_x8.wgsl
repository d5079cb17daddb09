// matvec_tokens for Q4_K weights on activations rounded to int8: Y[t, r] = sum_k W[r, k] * X[t, k] for
// t < S.n_tokens <= MAXM, X as quantize_q8.wgsl left it (XQ: the codes, XS: each block's (d, exact sum)).
//
// As matvec_tokens_q4k.wgsl (16-byte chunks, thread t of a row takes chunks t, t + TPR, ...), with a
// chunk meeting each token's codes as matvec_q4k_x8.wgsl's chunk_dot does: its 16 low nibbles (weights
// of sub-block 2g, in x's block blo) and 16 high nibbles (sub-block 2g + 1, block blo + 1) in 8
// dot4I8Packed, each half under its scale; the min terms from the blocks' exact sums of x, added by
// the chunk of the pair that starts its group (h = 0). The nibbles are cut once a chunk; a token costs
// two 16-byte loads of codes and two of scales, where f32 X costs eight (llama.cpp's MMVQ with
// several columns on q8_1).
// W: raw GGUF bytes [N, K] (K a multiple of 256); XQ: u32 [T, K / 4]; XS: vec2 [T, K / 32]; Y: f32
// [T, LDY] (LDY 0: N). MAXM from the prelude. Dispatch: ceil(N / (WG / TPR)) workgroups, split into
// (x, y) above 65535.

override K: u32;
override N: u32;
override LDY: u32 = 0u;
override TPR: u32 = 16u;
override WG: u32 = 64u;

@group(0) @binding(0) var<storage, read> W: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> XQ: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> XS: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read_write> Y: array<f32>;
@group(0) @binding(4) var<uniform> S: Step;

//!include q4k_chunk
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
    let srow = K / 32u;            // XS blocks a token
    let mask = 0x0f0f0f0fu;
    var acc: array<f32, MAXM>;
    if (row < N) {
        let rb = row * (K / 256u) * 9u;
        for (var c = t; c < K / 32u; c += TPR) {
            let ch = load_chunk(rb, c);
            let q = ch.q;
            let lo = vec4<u32>(q.x & mask, q.y & mask, q.z & mask, q.w & mask);
            let hi = vec4<u32>((q.x >> 4u) & mask, (q.y >> 4u) & mask, (q.z >> 4u) & mask, (q.w >> 4u) & mask);
            let h = ch.ci & 1u;
            let blo = 8u * ch.b + 2u * ch.g;       // x's block of the low nibbles; blo + 1 the high ones'
            let dm = unpack2x16float(ch.hdr.x);
            let sm = scale_min_pair(ch.hdr, ch.g);
            let a0 = dm.x * sm.x;
            let a1 = dm.x * sm.z;
            let starts = select(0.0, 1.0, h == 0u);  // this chunk adds the group's min terms
            for (var m = 0u; m < MAXM; m++) {
                if (m >= m_rows) { break; }                 // uniform: every thread has the same m_rows
                let xl = XQ[m * qrow + 2u * blo + h];
                let xh = XQ[m * qrow + 2u * blo + 2u + h];
                let il = dot16_i8(lo, xl);
                let ih = dot16_i8(hi, xh);
                let s0 = XS[m * srow + blo];
                let s1 = XS[m * srow + blo + 1u];
                acc[m] += a0 * s0.x * f32(il) + a1 * s1.x * f32(ih)
                        - starts * dm.y * (sm.y * s0.y + sm.w * s1.y);
            }
        }
    }
    sum_row_shares(lid, acc, m_rows);
    write_token_rows(lid, row, m_rows);
}
