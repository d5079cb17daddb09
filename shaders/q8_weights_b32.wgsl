// 32-weight block types for the int8 tile (matmul_q8_tile.wgsl), picked by the prelude with B32_TYPE
// (pyapp.gpu.kernels.Q8Tile.prelude) and quants.wgsl's readers (blocks are 2-byte aligned only):
//   0 Q4_0 { f16 d; u8 qs[16] }           w = d (q - 8),  q = nibble (element j < 16: low of qs[j])
//   1 Q5_0 { f16 d; u32 qh; u8 qs[16] }   w = d (q - 16), q = nibble | bit j of qh << 4
//   2 Q8_0 { f16 d; i8 qs[32] }           w = d q
// so a block is w = a q - b with a = d and b = 8 d, 16 d or 0, and its codes are int8 as they stand.
// A step of 64 weights is two blocks a row: job jh reads block jh, words 8 jh .. 8 jh + 7 of the step.

@group(0) @binding(0) var<storage, read> W: array<u32>;

const Q8_W_ALIGN: u32 = 64u;      // K is a multiple of this

// the 4 bits of h, each to bit 0 of its own byte
fn spread4(h: u32) -> u32 {
    return (h & 1u) | ((h & 2u) << 7u) | ((h & 4u) << 14u) | ((h & 8u) << 21u);
}

// Row `row`'s block of weights k + 32 jh .. k + 32 jh + 31: p = codes 0..15, q = codes 16..31, ab = (a, b)
fn q8_w_fetch(row: u32, jh: u32, k: u32) -> WJob {
    let bb = (row * (K / 32u) + k / 32u + jh) * QB;
    let d = f16at(bb);
    if (B32_TYPE == 2u) {
        return WJob(vec4<u32>(rd32(bb + 2u), rd32(bb + 6u), rd32(bb + 10u), rd32(bb + 14u)),
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
        return WJob(lo, hi, vec2<f32>(d, 16.0 * d));
    }
    return WJob(lo, hi, vec2<f32>(d, 8.0 * d));
}

fn q8_w_store(j: WJob, r: u32, jh: u32, k: u32) {
    for (var m = 0u; m < 4u; m++) {
        ws[(8u * jh + m) * GM + r / 4u][r % 4u] = j.p[m];
        ws[(8u * jh + 4u + m) * GM + r / 4u][r % 4u] = j.q[m];
    }
    wa[jh * GM + r / 4u][r % 4u] = j.ab.x;
    wb[jh * GM + r / 4u][r % 4u] = j.ab.y;
}
