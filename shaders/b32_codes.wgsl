// A 32-weight block's codes as int8, four to a word in dot4I8Packed's order, for the int8 kernels
// (q8_weights_b32.wgsl, moe_x8.wgsl); B32_TYPE from the prelude, quants.wgsl's readers (blocks are
// 2-byte aligned only):
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

// The block at byte bb of W.
fn b32_codes(bb: u32) -> B32 {
    let d = f16at(bb);
    if (B32_TYPE == 2u) {
        return B32(vec4<u32>(rd32(bb + 2u), rd32(bb + 6u), rd32(bb + 10u), rd32(bb + 14u)),
                   vec4<u32>(rd32(bb + 18u), rd32(bb + 22u), rd32(bb + 26u), rd32(bb + 30u)), vec2<f32>(d, 0.0));
    }
    let q0 = select(2u, 6u, B32_TYPE == 1u);
    let qs = vec4<u32>(rd32(bb + q0), rd32(bb + q0 + 4u), rd32(bb + q0 + 8u), rd32(bb + q0 + 12u));
    var lo = qs & vec4<u32>(0x0f0f0f0fu);
    var hi = (qs >> vec4<u32>(4u)) & vec4<u32>(0x0f0f0f0fu);
    if (B32_TYPE == 1u) {
        let qh = rd32(bb + 2u);
        lo |= vec4<u32>(spread4(qh), spread4(qh >> 4u), spread4(qh >> 8u), spread4(qh >> 12u)) << vec4<u32>(4u);
        hi |= vec4<u32>(spread4(qh >> 16u), spread4(qh >> 20u), spread4(qh >> 24u), spread4(qh >> 28u))
              << vec4<u32>(4u);
        return B32(lo, hi, vec2<f32>(d, 16.0 * d));
    }
    return B32(lo, hi, vec2<f32>(d, 8.0 * d));
}
