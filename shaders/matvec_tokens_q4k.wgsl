// matvec_tokens for Q4_K weights: Y[t, r] = sum_k W[r, k] * X[t, k] for t < S.n_tokens <= MAXM, each
// weight read once a step and dequantized once, then multiplied into every token's sum.
//
// Same contract as matvec_tokens.wgsl (speculative decoding's steps of a token and its drafts), with
// q4k_chunk.wgsl's reading of Q4_K: thread t of a row takes 16-byte chunks t, t + TPR, ...
// (32 weights each: 16 low nibbles of sub-block 2g, 16 high nibbles of sub-block 2g + 1); a chunk's
// weights become 8 vec4 (d * scale * q - dmin * min) once, then each token's 8 matching X vec4 are
// dotted with them. matvec_tokens.wgsl's generic path decodes every 4 weights' scales from the block
// header again (dq4), which dominated the step.
// W: raw GGUF bytes [N, K] (K a multiple of 256); X: f32 [T, K]; Y: f32 [T, LDY] (LDY 0: N). MAXM from
// the prelude. Dispatch: ceil(N / (WG / TPR)) workgroups, split into (x, y) above 65535.

override K: u32;
override N: u32;
override LDY: u32 = 0u;
override TPR: u32 = 16u;
override WG: u32 = 64u;

@group(0) @binding(0) var<storage, read> W: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> S: Step;

//!include q4k_chunk
//!include row_sums
//!include tokens_out

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let m_rows = min(S.n_tokens, MAXM);
    let row = (wid.x + wid.y * nwg.x) * (WG / TPR) + lid / TPR;
    let t = lid % TPR;
    let kg = K / 4u;
    var acc: array<f32, MAXM>;
    if (row < N) {
        let rb = row * (K / 256u) * 9u;
        for (var c = t; c < K / 32u; c += TPR) {
            let ch = load_chunk(rb, c);
            let q = ch.q;
            let dm = unpack2x16float(ch.hdr.x);
            let sm = scale_min_pair(ch.hdr, ch.g);
            let a0 = 255.0 * dm.x * sm.x;        // unpack4x8unorm gives nibble / 255
            let m0 = dm.y * sm.y;
            let a1 = 255.0 * dm.x * sm.z;
            let m1 = dm.y * sm.w;
            var w: array<vec4<f32>, 8>;           // the chunk's 32 weights: 16 of sub-block 2g, then 16 of 2g + 1
            for (var i = 0u; i < 4u; i++) {
                w[i] = unpack4x8unorm(q[i] & 0x0f0f0f0fu) * a0 - vec4<f32>(m0);
                w[4u + i] = unpack4x8unorm((q[i] >> 4u) & 0x0f0f0f0fu) * a1 - vec4<f32>(m1);
            }
            let xi = 64u * ch.b + 16u * ch.g + 4u * (ch.ci & 1u);   // X (vec4) of the chunk's first low-nibble weight
            for (var m = 0u; m < MAXM; m++) {
                if (m >= m_rows) { break; }                 // uniform: every thread has the same m_rows
                let xm = m * kg + xi;
                acc[m] += dot(w[0], X[xm]) + dot(w[1], X[xm + 1u]) + dot(w[2], X[xm + 2u]) + dot(w[3], X[xm + 3u])
                        + dot(w[4], X[xm + 8u]) + dot(w[5], X[xm + 9u]) + dot(w[6], X[xm + 10u])
                        + dot(w[7], X[xm + 11u]);
            }
        }
    }
    sum_row_shares(lid, acc, m_rows);
    write_token_rows(lid, row, m_rows);
}
