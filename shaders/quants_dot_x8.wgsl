// 32-weight units on x rounded to int8 (x8_round.wgsl's xq, xd) for matvec.wgsl's UNITS loop: the
// int8 counterparts of quants_dot.wgsl's dot32_<type>, picked by the prelude
// (pyapp.gpu.kernels.matvec_prelude with int8).

// Q6_K (block_q6_K { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }: 210 bytes, so 2-byte aligned
// only; w = d scales[j / 16] (q - 32), q = 4 bits of ql | 2 bits of qh << 4), unit u = weights
// 32u .. 32u + 31 (quants_dot.wgsl's q6k_unit): its 6-bit codes four to a word, made signed (q - 32) a byte at a time without
// borrows ((q | 0x80) - 0x20, then the top bit flipped back), meet x's codes in 8 dot4I8Packed, the
// two 16-weight halves under their own scales; no min term.
fn dot32_q6_k_x8(rowbase: u32, u: u32) -> f32 {
    let p = q6k_unit(rowbase, u);
    let x0 = xq[2u * u];
    let x1 = xq[2u * u + 1u];
    var a = vec2<i32>(0);
    for (var j = 0u; j < 8u; j++) {
        let signed = ((q6k_codes(p, j) | 0x80808080u) - 0x20202020u) ^ 0x80808080u;
        if (j < 4u) { a.x += dot4I8Packed(signed, x0[j]); } else { a.y += dot4I8Packed(signed, x1[j - 4u]); }
    }
    return xd[u].x * dot(p.scale, vec2<f32>(a));
}
