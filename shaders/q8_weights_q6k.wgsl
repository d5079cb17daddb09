// Q6_K weights for the int8 tile (matmul_q8_tile.wgsl), picked by the prelude
// (pyapp.gpu.kernels.Q8Tile.prelude; quants.wgsl's byte readers: blocks are 2-byte aligned only).
// block_q6_K { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d; }: 210 bytes a block of 256, w = d sc (q - 32)
// with a scale per 16 weights, so the tile runs with two sub-blocks per 32 (Q8_SUBS = 2) and b = 0: the
// codes are stored signed (q - 32 in -32..31), so no offset term on the activations' sums is needed.
// Weights 32 g' .. 32 g' + 31 of a block (g' = 4 h + g: half h, quarter g): low 4 bits = nibble g / 2 of
// ql[64 h + 32 (g % 2) + l], high 2 bits = bits 2 g of qh[32 h + l], scales[8 h + 2 g + l / 16].
// A step of 64 weights is two 32-blocks a row: job jh reads block 2 c + jh of the step's chunk c.

@group(0) @binding(0) var<storage, read> W: array<u32>;

const Q8_W_ALIGN: u32 = 256u;     // K is a multiple of this
const Q8_SUBS: u32 = 2u;          // a scale per 16 weights
const Q8_MIN_TERM: bool = false;  // b = 0: the codes are signed

// Four 6-bit codes (low nibbles lo, high pairs hi, a byte each) as signed bytes q - 32: with bit 7 set
// first, the per-byte subtraction never borrows from the next byte.
fn q6_signed(lo: u32, hi: u32) -> u32 {
    let q = lo | (hi << 4u);
    return ((q | 0x80808080u) - 0x20202020u) ^ 0x80808080u;
}

// The eight words from byte b (2-byte aligned, as blocks are): the aligned words they span (nine where b is
// not 4-byte aligned; the ninth loaded either way, unused then), each loaded once (an unaligned word read
// costs two loads).
fn words8(b: u32) -> array<u32, 8> {
    let a = b >> 2u;
    let odd = (b & 2u) != 0u;
    var w: array<u32, 9>;
    for (var i = 0u; i < 9u; i++) { w[i] = W[a + i]; }
    var out: array<u32, 8>;
    for (var m = 0u; m < 8u; m++) { out[m] = select(w[m], (w[m] >> 16u) | (w[m + 1u] << 16u), odd); }
    return out;
}

// Row `row`'s 32 weights k + 32 jh .. : p = codes 0..15 (scale ab.x), q = codes 16..31 (scale ab.y)
fn q8_w_fetch(row: u32, jh: u32, k: u32) -> WJob {
    let bb = (row * (K / 256u) + k / 256u) * 210u;
    let blk = 2u * ((k % 256u) / 64u) + jh;
    let h = blk / 4u;
    let g = blk % 4u;
    let ql = bb + 64u * h + 32u * (g & 1u);
    let qh = bb + 128u + 32u * h;
    let ls = 4u * (g >> 1u);
    let hs = 2u * g;
    let lw = words8(ql);
    let hw = words8(qh);
    var c: array<u32, 8>;
    for (var m = 0u; m < 8u; m++) {
        c[m] = q6_signed((lw[m] >> ls) & 0x0f0f0f0fu, (hw[m] >> hs) & 0x03030303u);
    }
    let d = f16at(bb + 208u);
    let sc = bitcast<i32>(rd16(bb + 192u + 8u * h + 2u * g));
    let a = d * vec2<f32>(f32(extractBits(sc, 0u, 8u)), f32(extractBits(sc, 8u, 8u)));
    return WJob(vec4<u32>(c[0], c[1], c[2], c[3]), vec4<u32>(c[4], c[5], c[6], c[7]), a);
}

fn q8_w_store(j: WJob, r: u32, jh: u32, k: u32) {
    put_codes(r, 2u * jh, j.p);
    put_codes(r, 2u * jh + 1u, j.q);
    put_scales(jh, r, j.ab);          // the scales of codes 0..15 and 16..31
}
