// unit8 for the 32-weight block types (Q4_0, Q5_0, Q8_0; B32_TYPE from the prelude): a unit is a block,
// its codes b32_codes.wgsl's (unsigned, w = d q - b), so the offset b meets the block's exact sum of x.

//!include b32_codes

fn unit8(rowbase: u32, u: u32) -> Unit8 {
    let b = b32_codes(rowbase + u * QB);
    return Unit8(b.lo, b.hi, vec2<f32>(b.ab.x), b.ab.y);
}
