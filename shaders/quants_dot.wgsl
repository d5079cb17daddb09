// Dot products of one 32-weight unit of a quantized row with X (matvec's inner loop).
//
// dot32_T(rowbase, u): sum over weights 32u..32u+31 of the row starting at byte
// rowbase, times xv(8u..8u+7) (vec4). One call decodes a K-quant sub-block's scale
// and min once for its 32 weights (dq4 would decode them for every 4), and reads
// the 4-byte-aligned K-quant blocks word by word. Needs K % 32 == 0; the including
// kernel declares X: array<vec4<f32>>. Types without a special version use dot32_generic.
// Layouts as in quants.wgsl (ggml-common.h).

fn dot32_generic(rowbase: u32, u: u32) -> f32 {
    let gpb = QK / 4u;
    var acc = 0.0;
    for (var j = 0u; j < 8u; j++) {
        let g = u * 8u + j;
        acc += dot(dq4(rowbase + (g / gpb) * QB, g % gpb), xv(g));
    }
    return acc;
}

fn xsum(x: vec4<f32>) -> f32 {
    return x.x + x.y + x.z + x.w;
}

// Q8_0: a unit is a whole 34-byte block
fn dot32_q8_0(rowbase: u32, u: u32) -> f32 {
    let bb = rowbase + u * 34u;
    var acc = 0.0;
    for (var j = 0u; j < 8u; j++) { acc += dot(i8x4(rd32(bb + 2u + 4u * j)), xv(u * 8u + j)); }
    return f16at(bb) * acc;
}

// Q4_0 / Q5_0: a unit is a whole block (18 / 22 bytes); low nibbles of word j are weights 4j .. 4j + 3,
// high nibbles 16 + 4j .. (nib4's order)
fn dot32_q4_0(rowbase: u32, u: u32) -> f32 {
    let bb = rowbase + u * 18u;
    var acc = vec4<f32>(0.0);
    for (var j = 0u; j < 4u; j++) {
        let q = bytes4(rd32(bb + 2u + 4u * j));
        acc += (vec4<f32>(q & vec4<u32>(15u)) - 8.0) * xv(u * 8u + j);
        acc += (vec4<f32>(q >> vec4<u32>(4u)) - 8.0) * xv(u * 8u + 4u + j);
    }
    return f16at(bb) * xsum(acc);
}

fn dot32_q5_0(rowbase: u32, u: u32) -> f32 {
    let bb = rowbase + u * 22u;
    let qh = rd32(bb + 2u);
    var acc = vec4<f32>(0.0);
    for (var j = 0u; j < 4u; j++) {
        let q = bytes4(rd32(bb + 6u + 4u * j));
        acc += (vec4<f32>((q & vec4<u32>(15u)) | hi4(qh, j)) - 16.0) * xv(u * 8u + j);
        acc += (vec4<f32>((q >> vec4<u32>(4u)) | hi4(qh, 4u + j)) - 16.0) * xv(u * 8u + 4u + j);
    }
    return f16at(bb) * xsum(acc);
}

// Q4_K: sub-block s = u % 8 of a 144-byte block: w = d * sc * q - dmin * m
fn dot32_q4_k(rowbase: u32, u: u32) -> f32 {
    let bb = rowbase + (u >> 3u) * 144u;
    let s = u & 7u;
    let dm = unpack2x16float(W[bb >> 2u]);
    let sm = scale_min_k4(bb + 4u, s);
    let sh = vec4<u32>(4u * (s & 1u));
    let qw = (bb + 16u + 32u * (s >> 1u)) >> 2u;
    var acc = 0.0;
    var xs = 0.0;
    for (var j = 0u; j < 8u; j++) {
        let x = xv(u * 8u + j);
        acc += dot(vec4<f32>((bytes4(W[qw + j]) >> sh) & vec4<u32>(15u)), x);
        xs += xsum(x);
    }
    return dm.x * sm.x * acc - dm.y * sm.y * xs;
}

// Q5_K: as Q4_K with the fifth bit s of qh[l]
fn dot32_q5_k(rowbase: u32, u: u32) -> f32 {
    let bb = rowbase + (u >> 3u) * 176u;
    let s = u & 7u;
    let dm = unpack2x16float(W[bb >> 2u]);
    let sm = scale_min_k4(bb + 4u, s);
    let sh = vec4<u32>(4u * (s & 1u));
    let qw = (bb + 48u + 32u * (s >> 1u)) >> 2u;
    let hw = (bb + 16u) >> 2u;
    var acc = 0.0;
    var xs = 0.0;
    for (var j = 0u; j < 8u; j++) {
        let x = xv(u * 8u + j);
        let lo = (bytes4(W[qw + j]) >> sh) & vec4<u32>(15u);
        let hb = ((bytes4(W[hw + j]) >> vec4<u32>(s)) & vec4<u32>(1u)) << vec4<u32>(4u);
        acc += dot(vec4<f32>(lo | hb), x);
        xs += xsum(x);
    }
    return dm.x * sm.x * acc - dm.y * sm.y * xs;
}

// Q6_K: where unit u of a row lies and its codes (q6k_unit.wgsl, also for quants_dot_x8.wgsl's int8 unit)
//!include q6k_unit

fn dot32_q6_k(rowbase: u32, u: u32) -> f32 {
    let p = q6k_unit(rowbase, u);
    var a = vec2<f32>(0.0);
    for (var j = 0u; j < 8u; j++) {
        let v = dot(vec4<f32>(bytes4(q6k_codes(p, j))) - 32.0, xv(u * 8u + j));
        if (j < 4u) { a.x += v; } else { a.y += v; }
    }
    return dot(p.scale, a);
}
