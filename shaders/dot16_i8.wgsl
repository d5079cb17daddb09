// dot16_i8: 16 int8 codes four to a word (dot4I8Packed's order) against 16 more: the integer sum of the
// products. Half a 32-weight unit of the int8 kernels (moe_x8.wgsl, matvec_tokens_x8.wgsl,
// matvec_tokens_q4k_x8.wgsl).

fn dot16_i8(a: vec4<u32>, b: vec4<u32>) -> i32 {
    return dot4I8Packed(a.x, b.x) + dot4I8Packed(a.y, b.y) + dot4I8Packed(a.z, b.z) + dot4I8Packed(a.w, b.w);
}
