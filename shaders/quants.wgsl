// Dequantization of GGUF/GGML blocks read straight from raw file bytes.
//
// Layout: the including kernel declares `W: array<u32>` holding a tensor's raw
// GGUF bytes (little endian). Blocks are generally not 4-byte aligned (Q8_0 is
// 34 bytes, Q4_0 18, ...), so every read goes through rd8/rd16/rd32, which
// take byte offsets and combine neighbouring words.
//
// Each type T provides dq4_T(bb, i) -> vec4<f32>: weights 4i..4i+3 of the block
// that starts at byte bb. Python (pyapp.gpu.kernels.quant_prelude) prepends
//   const QK: u32 = <elements per block>; const QB: u32 = <bytes per block>;
//   fn dq4(bb: u32, i: u32) -> vec4<f32> { return dq4_T(bb, i); }
// Float types use a 4-element pseudo block (QK = 4).
//
// Mirrors ggml-common.h block structs and ggml-quants.c dequantize_row_*
// (element order within blocks included).

fn rd8(b: u32) -> u32 {
    return (W[b >> 2u] >> ((b & 3u) * 8u)) & 0xffu;
}

fn rd16(b: u32) -> u32 {
    let s = (b & 3u) * 8u;
    let w = W[b >> 2u];
    if (s <= 16u) { return (w >> s) & 0xffffu; }
    return (w >> 24u) | ((W[(b >> 2u) + 1u] & 0xffu) << 8u);
}

fn rd32(b: u32) -> u32 {
    let s = (b & 3u) * 8u;
    let w = W[b >> 2u];
    if (s == 0u) { return w; }
    return (w >> s) | (W[(b >> 2u) + 1u] << (32u - s));
}

fn f16at(b: u32) -> f32 {
    return unpack2x16float(rd16(b)).x;
}

// four signed / unsigned bytes of a word as floats
fn i8x4(q: u32) -> vec4<f32> {
    let v = bitcast<i32>(q);
    return vec4<f32>(vec4<i32>(extractBits(v, 0u, 8u), extractBits(v, 8u, 8u),
                               extractBits(v, 16u, 8u), extractBits(v, 24u, 8u)));
}

fn bytes4(q: u32) -> vec4<u32> {
    return vec4<u32>(q, q >> 8u, q >> 16u, q >> 24u) & vec4<u32>(0xffu);
}

// 32-element blocks with 16 bytes of nibbles: element j < 16 is the low nibble
// of byte j, element j + 16 the high nibble. Group i (of 8) -> 4 nibbles.
fn nib4(qs: u32, i: u32) -> vec4<u32> {
    let q = rd32(qs + 4u * (i & 3u)) >> ((i >> 2u) * 4u);
    return vec4<u32>(q, q >> 8u, q >> 16u, q >> 24u) & vec4<u32>(15u);
}

// bits e..e+3 of a 32-bit high-bit mask (Q5_0/Q5_1), as 0/16
fn hi4(qh: u32, i: u32) -> vec4<u32> {
    let h = qh >> (4u * i);
    return (vec4<u32>(h, h >> 1u, h >> 2u, h >> 3u) & vec4<u32>(1u)) << vec4<u32>(4u);
}

fn dq4_f32(bb: u32, i: u32) -> vec4<f32> {
    let w = bb >> 2u;
    if ((bb & 3u) == 0u) {
        return bitcast<vec4<f32>>(vec4<u32>(W[w], W[w + 1u], W[w + 2u], W[w + 3u]));
    }
    return bitcast<vec4<f32>>(vec4<u32>(rd32(bb), rd32(bb + 4u), rd32(bb + 8u), rd32(bb + 12u)));
}

fn dq4_f16(bb: u32, i: u32) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(rd32(bb)), unpack2x16float(rd32(bb + 4u)));
}

fn dq4_bf16(bb: u32, i: u32) -> vec4<f32> {
    let a = rd32(bb);
    let b = rd32(bb + 4u);
    return bitcast<vec4<f32>>(vec4<u32>(a << 16u, a & 0xffff0000u, b << 16u, b & 0xffff0000u));
}

// block_q8_0 { f16 d; i8 qs[32]; }  34 bytes
fn dq4_q8_0(bb: u32, i: u32) -> vec4<f32> {
    return f16at(bb) * i8x4(rd32(bb + 2u + 4u * i));
}

// block_q4_0 { f16 d; u8 qs[16]; }  18 bytes, w = d * (q - 8)
fn dq4_q4_0(bb: u32, i: u32) -> vec4<f32> {
    return f16at(bb) * (vec4<f32>(nib4(bb + 2u, i)) - 8.0);
}

// block_q4_1 { f16 d, m; u8 qs[16]; }  20 bytes, w = d * q + m
fn dq4_q4_1(bb: u32, i: u32) -> vec4<f32> {
    let dm = unpack2x16float(rd32(bb));
    return dm.x * vec4<f32>(nib4(bb + 4u, i)) + dm.y;
}

// block_q5_0 { f16 d; u8 qh[4]; u8 qs[16]; }  22 bytes, 5th bit of element e = bit e of qh
fn dq4_q5_0(bb: u32, i: u32) -> vec4<f32> {
    let q = nib4(bb + 6u, i) | hi4(rd32(bb + 2u), i);
    return f16at(bb) * (vec4<f32>(q) - 16.0);
}

// block_q5_1 { f16 d, m; u8 qh[4]; u8 qs[16]; }  24 bytes
fn dq4_q5_1(bb: u32, i: u32) -> vec4<f32> {
    let dm = unpack2x16float(rd32(bb));
    let q = nib4(bb + 8u, i) | hi4(rd32(bb + 4u), i);
    return dm.x * vec4<f32>(q) + dm.y;
}

// 6-bit scale and min j (0..7) of the 12 packed scale bytes at sb (get_scale_min_k4)
fn scale_min_k4(sb: u32, j: u32) -> vec2<f32> {
    if (j < 4u) {
        return vec2<f32>(f32(rd8(sb + j) & 63u), f32(rd8(sb + j + 4u) & 63u));
    }
    let x = rd8(sb + j + 4u);
    let sc = (x & 15u) | ((rd8(sb + j - 4u) >> 6u) << 4u);
    let m = (x >> 4u) | ((rd8(sb + j) >> 6u) << 4u);
    return vec2<f32>(f32(sc), f32(m));
}

// block_q4_K { f16 d, dmin; u8 scales[12]; u8 qs[128]; }  144 bytes, 256 weights.
// 64-weight chunk c: weights 0..31 = low nibbles of qs[32c..], 32..63 = high nibbles;
// sub-block s = 2c + hi has scale/min s: w = d * sc * q - dmin * m
fn dq4_q4_k(bb: u32, i: u32) -> vec4<f32> {
    let c = i >> 4u;
    let hi = (i >> 3u) & 1u;
    let l = 4u * (i & 7u);
    let dm = unpack2x16float(rd32(bb));
    let sm = scale_min_k4(bb + 4u, 2u * c + hi);
    let q = (bytes4(rd32(bb + 16u + 32u * c + l)) >> vec4<u32>(4u * hi)) & vec4<u32>(15u);
    return dm.x * sm.x * vec4<f32>(q) - dm.y * sm.y;
}

// block_q5_K { f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]; }  176 bytes.
// As Q4_K plus a 5th bit: bit s of qh[l] for weight l of sub-block s.
fn dq4_q5_k(bb: u32, i: u32) -> vec4<f32> {
    let c = i >> 4u;
    let hi = (i >> 3u) & 1u;
    let l = 4u * (i & 7u);
    let s = 2u * c + hi;
    let dm = unpack2x16float(rd32(bb));
    let sm = scale_min_k4(bb + 4u, s);
    let lo = (bytes4(rd32(bb + 48u + 32u * c + l)) >> vec4<u32>(4u * hi)) & vec4<u32>(15u);
    let h = ((bytes4(rd32(bb + 16u + l)) >> vec4<u32>(s)) & vec4<u32>(1u)) << vec4<u32>(4u);
    return dm.x * sm.x * vec4<f32>(lo | h) - dm.y * sm.y;
}

// block_q6_K { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d; }  210 bytes.
// Weight e: half h = e / 128, quarter t = (e % 128) / 32, l = e % 32:
// low 4 bits = nibble (t >> 1) of ql[64h + 32(t & 1) + l], high 2 bits = bits 2t of qh[32h + l],
// scale = scales[8h + l / 16 + 2t]; w = d * scale * (q - 32)
fn dq4_q6_k(bb: u32, i: u32) -> vec4<f32> {
    let h = i >> 5u;
    let t = (i >> 3u) & 3u;
    let l = 4u * (i & 7u);
    let lo = (bytes4(rd32(bb + 64u * h + 32u * (t & 1u) + l)) >> vec4<u32>(4u * (t >> 1u))) & vec4<u32>(15u);
    let hb = ((bytes4(rd32(bb + 128u + 32u * h + l)) >> vec4<u32>(2u * t)) & vec4<u32>(3u)) << vec4<u32>(4u);
    let sc = f32(extractBits(bitcast<i32>(rd8(bb + 192u + 8u * h + l / 16u + 2u * t)), 0u, 8u));
    return f16at(bb + 208u) * sc * (vec4<f32>(lo | hb) - 32.0);
}

// block_mxfp4 { u8 e; u8 qs[16]; }  17 bytes, nibbles as Q4_0; w = fp4_e2m1(q) * 2^(e - 127)
fn fp4(q: u32) -> f32 {
    let m = q & 7u;
    var v = f32(m);                                  // 0, 1, 2, 3 -> 0, 0.5, 1, 1.5 below
    if (m >= 4u) { v = f32((2u + (m & 1u)) << ((m >> 1u) - 1u)); }   // 4, 6, 8, 12
    return select(v, -v, q >= 8u) * 0.5;
}

fn dq4_mxfp4(bb: u32, i: u32) -> vec4<f32> {
    let q = nib4(bb + 1u, i);
    let s = ldexp(1.0, i32(rd8(bb)) - 127);
    return s * vec4<f32>(fp4(q.x), fp4(q.y), fp4(q.z), fp4(q.w));
}
