// q4k_chunk: Q4_K weights read 16 bytes at a time, shared by the Q4_K chunk matvecs
// (matvec_q4k_common.wgsl) and matvec_tokens_q4k.wgsl. The includer declares W: array<vec4<u32>>
// (raw GGUF bytes).
//
// A Q4_K block (144 bytes = 9 x vec4<u32>): word 0 holds d, dmin and the 12 scale bytes,
// words 1..8 the 128 quant bytes. Chunk c (of 8) of a block holds quant bytes 16c..16c+15,
// that is bytes l = 16h..16h+15 (h = c & 1) of the 32-byte group g = c >> 1: their low nibbles
// are weights 64g + l of sub-block 2g, their high nibbles weights 64g + 32 + l of sub-block
// 2g + 1 (ggml-common.h block_q4_K). Rows start on a 16-byte boundary (144 = 9 x 16), so every
// load is aligned.

// (scale, min) of sub-blocks 2g and 2g + 1 as (sc0, m0, sc1, m1) (ggml's get_scale_min_k4 on
// the header words h.y, h.z, h.w = scale bytes 0-3, 4-7, 8-11), without indexing a vector by
// a runtime value: two 6-bit fields are cut out of a word at once.
fn scale_min_pair(h: vec4<u32>, g: u32) -> vec4<f32> {
    let s = 16u * (g & 1u);                   // the pair's first byte within its word
    let low = (h.y >> s) & 0x3f3fu;           // g < 2: scales in bytes 0-3, mins in 4-7
    let lowm = (h.z >> s) & 0x3f3fu;
    let q = h.w >> s;                         // g >= 2: low 4 bits in bytes 8-11, top 2 bits on top of 0-7
    let high = (q & 0x0f0fu) | (((h.y >> s) >> 2u) & 0x3030u);
    let highm = ((q >> 4u) & 0x0f0fu) | (((h.z >> s) >> 2u) & 0x3030u);
    let sc = select(low, high, g >= 2u);
    let m = select(lowm, highm, g >= 2u);
    return vec4<f32>(f32(sc & 0xffu), f32(m & 0xffu), f32(sc >> 8u), f32(m >> 8u));
}

// The chunk at word c of the row whose first block is word `rb`: (block b, chunk ci of 8, its group
// g of 32 quant bytes, its block header, its 16 quant bytes).
struct Chunk { b: u32, ci: u32, g: u32, hdr: vec4<u32>, q: vec4<u32> }

fn load_chunk(rb: u32, c: u32) -> Chunk {
    let b = c >> 3u;
    let ci = c & 7u;
    return Chunk(b, ci, ci >> 1u, W[rb + 9u * b], W[rb + 9u * b + 1u + ci]);
}
