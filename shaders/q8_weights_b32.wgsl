// 32-weight block types (Q4_0, Q5_0, Q8_0: b32_codes.wgsl) for the int8 tile (matmul_q8_tile.wgsl),
// picked by the prelude with B32_TYPE (pyapp.gpu.kernels.Q8Tile.prelude).
// A step of 64 weights is two blocks a row: job jh reads block jh, words 8 jh .. 8 jh + 7 of the step.

@group(0) @binding(0) var<storage, read> W: array<u32>;

const Q8_W_ALIGN: u32 = 64u;      // K is a multiple of this
const Q8_SUBS: u32 = 1u;          // one scale per 32 weights
const Q8_MIN_TERM: bool = B32_TYPE != 2u;    // b = 8 d, 16 d; Q8_0: 0

//!include b32_codes

// Row `row`'s block of weights k + 32 jh .. k + 32 jh + 31: p = codes 0..15, q = codes 16..31, ab = (a, b)
fn q8_w_fetch(row: u32, jh: u32, k: u32) -> WJob {
    let c = b32_codes((row * (K / 32u) + k / 32u + jh) * QB);
    return WJob(c.lo, c.hi, c.ab);
}

fn q8_w_store(j: WJob, r: u32, jh: u32, k: u32) {
    put_codes(r, 2u * jh, j.p);
    put_codes(r, 2u * jh + 1u, j.q);
    put_scales(jh, r, j.ab);
}
