// q6k_unit: where a 32-weight unit of a Q6_K row lies, its scales and its 6-bit codes, for the Q6_K
// units of quants_dot.wgsl, quants_dot_x8.wgsl and unit8_q6k.wgsl. Needs quants.wgsl's readers.
//
// Q6_K: unit s = u % 8 is half h = s / 4, quarter t = s % 4 of a 210-byte block; its first
// 16 weights use scale 8h + 2t, the next 16 scale 8h + 2t + 1. Where unit u of the row at rowbase
// lies:
struct Q6kUnit {
    lo_at: u32,           // its low 4 bits: bytes lo_at .., shifted right by lo_sh
    lo_sh: u32,
    hi_at: u32,           // its top 2 bits: bytes hi_at .., shifted right by hi_sh
    hi_sh: u32,
    scale: vec2<f32>,     // d times the scales of its two halves of 16
}

fn q6k_unit(rowbase: u32, u: u32) -> Q6kUnit {
    let bb = rowbase + (u >> 3u) * 210u;
    let s = u & 7u;
    let h = s >> 2u;
    let t = s & 3u;
    let sc = bb + 192u + 8u * h + 2u * t;
    let s0 = f32(extractBits(bitcast<i32>(rd8(sc)), 0u, 8u));
    let s1 = f32(extractBits(bitcast<i32>(rd8(sc + 1u)), 0u, 8u));
    return Q6kUnit(bb + 64u * h + 32u * (t & 1u), 4u * (t >> 1u), bb + 128u + 32u * h, 2u * t,
                   f16at(bb + 208u) * vec2<f32>(s0, s1));
}

// Word j (0..7) of the unit's 6-bit codes q (0..63; w = d scale (q - 32)), four to a word.
fn q6k_codes(p: Q6kUnit, j: u32) -> u32 {
    return ((rd32(p.lo_at + 4u * j) >> p.lo_sh) & 0x0f0f0f0fu) | (((rd32(p.hi_at + 4u * j) >> p.hi_sh) & 0x03030303u) << 4u);
}

// Word j of the codes made signed (q - 32) a byte at a time without borrows ((q | 0x80) - 0x20, then the
// top bit flipped back): the int8 units' (quants_dot_x8.wgsl, unit8_q6k.wgsl).
fn q6k_signed_codes(p: Q6kUnit, j: u32) -> u32 {
    return ((q6k_codes(p, j) | 0x80808080u) - 0x20202020u) ^ 0x80808080u;
}
