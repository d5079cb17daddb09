// How the Q4_K chunk matvec (matvec_q4k_common.wgsl) meets x rounded to int8, as llama.cpp's MMVQ
// does with q8_1: each workgroup rounds x (read through xv()) once into workgroup memory
// (x8_round.wgsl; or its producer did: x8_stored.wgsl), and a chunk's 32 nibbles meet their 32 codes in 8 dot4I8Packed: no nibble-to-float
// conversion, a quarter of f32 x's reads. A chunk's 16 low nibbles lie in one
// block of x (weights 64g + 16h .. of sub-block 2g), its 16 high nibbles in the next (sub-block
// 2g + 1), so each half takes one scale. The min terms use the blocks' exact sums of x, added by
// the chunk of the pair that starts its group (h = 0), so they carry no rounding of x.

// (the prelude includes x8_round.wgsl or x8_stored.wgsl before this file)

// Chunk c of the row whose first block is word `rb`: its 32 weights . x.
fn chunk_dot(rb: u32, c: u32) -> f32 {
    let ch = load_chunk(rb, c);
    let q = ch.q;
    if (PROBE == 1u) { return f32(ch.hdr.x ^ q.x ^ q.y ^ q.z ^ q.w); }
    let h = ch.ci & 1u;
    let blo = 8u * ch.b + 2u * ch.g;            // x's block of the low nibbles; blo + 1 the high ones'
    let xl = x8q(2u * blo + h);
    let xh = x8q(2u * blo + 2u + h);
    let m = 0x0f0f0f0fu;
    let lo = dot4I8Packed(q.x & m, xl.x) + dot4I8Packed(q.y & m, xl.y)
           + dot4I8Packed(q.z & m, xl.z) + dot4I8Packed(q.w & m, xl.w);
    let hi = dot4I8Packed((q.x >> 4u) & m, xh.x) + dot4I8Packed((q.y >> 4u) & m, xh.y)
           + dot4I8Packed((q.z >> 4u) & m, xh.z) + dot4I8Packed((q.w >> 4u) & m, xh.w);
    let dm = unpack2x16float(ch.hdr.x);
    let sm = scale_min_pair(ch.hdr, ch.g);
    let s0 = x8d(blo);
    let s1 = x8d(blo + 1u);
    let mins = select(0.0, sm.y * s0.y + sm.w * s1.y, h == 0u);
    return dm.x * (sm.x * s0.x * f32(lo) + sm.z * s1.x * f32(hi)) - dm.y * mins;
}
