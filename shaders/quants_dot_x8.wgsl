// 32-weight units on x rounded to int8 (x8q() and x8d(): x8_round.wgsl or x8_stored.wgsl) for matvec.wgsl's UNITS loop: the
// int8 counterparts of quants_dot.wgsl's dot32_<type>, picked by the prelude
// (pyapp.gpu.kernels.matvec_prelude with int8).

// Q6_K (block_q6_K { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }: 210 bytes, so 2-byte aligned
// only; w = d scales[j / 16] (q - 32), q = 4 bits of ql | 2 bits of qh << 4), unit u = weights
// 32u .. 32u + 31 (quants_dot.wgsl's q6k_unit): its 6-bit codes four to a word, made signed (q - 32) a byte at a time without
// borrows ((q | 0x80) - 0x20, then the top bit flipped back), meet x's codes in 8 dot4I8Packed, the
// two 16-weight halves under their own scales; no min term.
fn dot32_q6_k_x8(rowbase: u32, u: u32) -> f32 {
    let p = q6k_unit(rowbase, u);
    let x0 = x8q(2u * u);
    let x1 = x8q(2u * u + 1u);
    var a = vec2<i32>(0);
    for (var j = 0u; j < 8u; j++) {
        let signed = q6k_signed_codes(p, j);
        if (j < 4u) { a.x += dot4I8Packed(signed, x0[j]); } else { a.y += dot4I8Packed(signed, x1[j - 4u]); }
    }
    return x8d(u).x * dot(p.scale, vec2<f32>(a));
}

// The 32-weight block types (one block a unit, u = block u of the row): their codes made signed int8
// four to a word and met with x's codes in 8 dot4I8Packed; d_w * d_x * the integer sum (llama.cpp's
// vec_dot_q4_0_q8_1 and kin). A nibble or 5-bit code q becomes q - 8 / q - 16 a byte at a time
// without borrows: ((q | 0x80) - off) ^ 0x80. Low nibbles of word j are weights 4j .. 4j + 3 (x0[j]),
// high nibbles weights 16 + 4j .. (x1[j]), as quants.wgsl's nib4.
fn signed_codes(q: u32, off: u32) -> u32 {
    return ((q | 0x80808080u) - off) ^ 0x80808080u;
}

// Q4_0 (block_q4_0 { f16 d; u8 qs[16] }: 18 bytes), w = d (q - 8)
fn dot32_q4_0_x8(rowbase: u32, u: u32) -> f32 {
    let bb = rowbase + u * 18u;
    let x0 = x8q(2u * u);
    let x1 = x8q(2u * u + 1u);
    var a = 0;
    for (var j = 0u; j < 4u; j++) {
        let q = rd32(bb + 2u + 4u * j);
        a += dot4I8Packed(signed_codes(q & 0x0f0f0f0fu, 0x08080808u), x0[j]);
        a += dot4I8Packed(signed_codes((q >> 4u) & 0x0f0f0f0fu, 0x08080808u), x1[j]);
    }
    return f16at(bb) * x8d(u).x * f32(a);
}

// Q5_0 (block_q5_0 { f16 d; u8 qh[4]; u8 qs[16] }: 22 bytes), w = d (q - 16), bit 4 of weight e = bit e
// of qh: four bits of qh spread to bit 4 of four bytes
fn high_bits4(h: u32) -> u32 {
    return ((h & 1u) << 4u) | ((h & 2u) << 11u) | ((h & 4u) << 18u) | ((h & 8u) << 25u);
}

fn dot32_q5_0_x8(rowbase: u32, u: u32) -> f32 {
    let bb = rowbase + u * 22u;
    let qh = rd32(bb + 2u);
    let x0 = x8q(2u * u);
    let x1 = x8q(2u * u + 1u);
    var a = 0;
    for (var j = 0u; j < 4u; j++) {
        let q = rd32(bb + 6u + 4u * j);
        let lo = (q & 0x0f0f0f0fu) | high_bits4(qh >> (4u * j));
        let hi = ((q >> 4u) & 0x0f0f0f0fu) | high_bits4(qh >> (16u + 4u * j));
        a += dot4I8Packed(signed_codes(lo, 0x10101010u), x0[j]);
        a += dot4I8Packed(signed_codes(hi, 0x10101010u), x1[j]);
    }
    return f16at(bb) * x8d(u).x * f32(a);
}

// Q8_0 (block_q8_0 { f16 d; i8 qs[32] }: 34 bytes), w = d q: the codes are int8 already
fn dot32_q8_0_x8(rowbase: u32, u: u32) -> f32 {
    let bb = rowbase + u * 34u;
    let x0 = x8q(2u * u);
    let x1 = x8q(2u * u + 1u);
    var a = 0;
    for (var j = 0u; j < 4u; j++) {
        a += dot4I8Packed(rd32(bb + 2u + 4u * j), x0[j]);
        a += dot4I8Packed(rd32(bb + 18u + 4u * j), x1[j]);
    }
    return f16at(bb) * x8d(u).x * f32(a);
}
