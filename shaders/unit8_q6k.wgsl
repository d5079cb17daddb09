// unit8 for Q6_K: a unit's 6-bit codes made signed (q - 32, q6k_signed_codes), its two halves of 16 under their
// own scales.

//!include q6k_unit

fn unit8(rowbase: u32, u: u32) -> Unit8 {
    let p = q6k_unit(rowbase, u);
    var c: array<u32, 8>;
    for (var j = 0u; j < 8u; j++) { c[j] = q6k_signed_codes(p, j); }
    return Unit8(vec4<u32>(c[0], c[1], c[2], c[3]), vec4<u32>(c[4], c[5], c[6], c[7]), p.scale, 0.0);
}
