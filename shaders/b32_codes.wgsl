// A 32-weight block's codes as int8, four to a word in dot4I8Packed's order, for the int8 kernels
// (q8_weights_b32.wgsl, moe_x8.wgsl, unit8_b32.wgsl); B32_TYPE from the prelude, W an array<u32> (blocks
// are 2-byte aligned only):
//   0 Q4_0 { f16 d; u8 qs[16] }           w = d (q - 8),  q = nibble (element j < 16: low of qs[j])
//   1 Q5_0 { f16 d; u32 qh; u8 qs[16] }   w = d (q - 16), q = nibble | bit j of qh << 4
//   2 Q8_0 { f16 d; i8 qs[32] }           w = d q
// so a block is w = a q - b with a = d and b = 8 d, 16 d or 0.

struct B32 {
    lo: vec4<u32>,        // codes of elements 0..15
    hi: vec4<u32>,        // codes of elements 16..31
    ab: vec2<f32>,        // (a, b)
}

// the 4 bits of h, each to bit 0 of its own byte
fn spread4(h: u32) -> u32 {
    return (h & 1u) | ((h & 2u) << 7u) | ((h & 4u) << 14u) | ((h & 8u) << 21u);
}

// Aligned words of W a block spans (its 18, 22 or 34 bytes from byte 0 or 2 of the first).
const B32_WORDS: u32 = select(select(5u, 6u, B32_TYPE == 1u), 9u, B32_TYPE == 2u);

// The block's bytes 2 + 4 j .. 5 + 4 j from its words w0 = w[j], w1 = w[j + 1]; odd: the block starts at byte
// 2 of its first word.
fn b32_word(w0: u32, w1: u32, odd: bool) -> u32 {
    return select((w0 >> 16u) | (w1 << 16u), w1, odd);
}

// The block at byte bb of W: its words loaded once each (an unaligned word read costs two loads).
fn b32_codes(bb: u32) -> B32 {
    let a = bb >> 2u;
    let odd = (bb & 2u) != 0u;
    var w: array<u32, 9>;
    for (var i = 0u; i < B32_WORDS; i++) { w[i] = W[a + i]; }
    let d = unpack2x16float(select(w[0] & 0xffffu, w[0] >> 16u, odd)).x;
    if (B32_TYPE == 2u) {
        return B32(vec4<u32>(b32_word(w[0], w[1], odd), b32_word(w[1], w[2], odd), b32_word(w[2], w[3], odd),
                             b32_word(w[3], w[4], odd)),
                   vec4<u32>(b32_word(w[4], w[5], odd), b32_word(w[5], w[6], odd), b32_word(w[6], w[7], odd),
                             b32_word(w[7], w[8], odd)), vec2<f32>(d, 0.0));
    }
    let j0 = select(0u, 1u, B32_TYPE == 1u);      // the nibbles' first word (after Q5_0's qh)
    let qs = vec4<u32>(b32_word(w[j0], w[j0 + 1u], odd), b32_word(w[j0 + 1u], w[j0 + 2u], odd),
                       b32_word(w[j0 + 2u], w[j0 + 3u], odd), b32_word(w[j0 + 3u], w[j0 + 4u], odd));
    var lo = qs & vec4<u32>(0x0f0f0f0fu);
    var hi = (qs >> vec4<u32>(4u)) & vec4<u32>(0x0f0f0f0fu);
    if (B32_TYPE == 1u) {
        let qh = b32_word(w[0], w[1], odd);
        lo |= vec4<u32>(spread4(qh), spread4(qh >> 4u), spread4(qh >> 8u), spread4(qh >> 12u)) << vec4<u32>(4u);
        hi |= vec4<u32>(spread4(qh >> 16u), spread4(qh >> 20u), spread4(qh >> 24u), spread4(qh >> 28u))
              << vec4<u32>(4u);
        return B32(lo, hi, vec2<f32>(d, 16.0 * d));
    }
    return B32(lo, hi, vec2<f32>(d, 8.0 * d));
}
