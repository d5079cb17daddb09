// Q4_K weights for the int8 tile (matmul_q8_tile.wgsl), picked by the prelude
// (pyapp.gpu.kernels.Q8Tile.prelude). block_q4_K { f16 d, dmin; u8 scales[12]; u8 qs[128] }: 144 bytes,
// 9 vec4 a block of 256. A step of 64 weights reads one 32-byte chunk c of qs per row, whose low nibbles
// are sub-block 2c and high nibbles sub-block 2c + 1 (w = d sc q - dmin m), each word four codes in
// dot4I8Packed's order: a word of nibbles is two words of int8 codes after a mask. Job half jh reads
// the chunk's words 4 jh .. 4 jh + 3 (and half 0 the block's header, for the two scales and mins).

@group(0) @binding(0) var<storage, read> W: array<vec4<u32>>;

const Q8_W_ALIGN: u32 = 256u;     // K is a multiple of this
const Q8_SUBS: u32 = 1u;          // one scale per 32 weights
const Q8_MIN_TERM: bool = true;   // b = dmin m

// 6-bit scale and min j (0..7) from a block's first 16 bytes h (scales in words h.y, h.z, h.w), as
// get_scale_min_k4
fn scale_min(h: vec4<u32>, j: u32) -> vec2<f32> {
    let s = array<u32, 3>(h.y, h.z, h.w);
    let byte = (j % 4u) * 8u;
    if (j < 4u) {
        return vec2<f32>(f32((s[0] >> byte) & 63u), f32((s[1] >> byte) & 63u));
    }
    let x = (s[2] >> byte) & 255u;
    let lo = (s[0] >> byte) & 255u;
    let mid = (s[1] >> byte) & 255u;
    return vec2<f32>(f32((x & 15u) | ((lo >> 6u) << 4u)), f32((x >> 4u) | ((mid >> 6u) << 4u)));
}

// Row `row`'s weights k .. k + 63, half jh: p = the block's header (half 0 only: it stores the scales),
// q = the chunk's words 4 jh ..
fn q8_w_fetch(row: u32, jh: u32, k: u32) -> WJob {
    let blk = (row * (K / 256u) + k / 256u) * 9u;
    var p = vec4<u32>(0u);
    if (jh == 0u) { p = W[blk]; }
    return WJob(p, W[blk + 1u + 2u * ((k % 256u) / 64u) + jh], vec2<f32>(0.0));
}

fn q8_w_store(j: WJob, r: u32, jh: u32, k: u32) {
    put_codes(r, jh, j.q & vec4<u32>(0x0f0f0f0fu));               // words 4 jh ..: sub-block 2c's codes
    put_codes(r, 2u + jh, (j.q >> vec4<u32>(4u)) & vec4<u32>(0x0f0f0f0fu));   // 8 + 4 jh ..: 2c + 1's
    if (jh == 0u) {
        let dm = unpack2x16float(j.p.x);
        let c = (k % 256u) / 64u;
        let s0 = scale_min(j.p, 2u * c);
        let s1 = scale_min(j.p, 2u * c + 1u);
        put_scales(0u, r, dm * s0);
        put_scales(1u, r, dm * s1);
    }
}
