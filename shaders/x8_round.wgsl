// A block of 32 activations rounded to int8 into the including kernel's workgroup memory (xq: codes,
// 16 a vec4, byte i of word w = element 4 w + i; xd: (d, exact sum of the block's x) a block), by
// quantize_q8.wgsl's rule: d = max |x| / 127, q = round(x / d), 0 for an all-zero block. Used by the
// decode kernels on int8 x (matvec_q4k_x8.wgsl, moe_x8.wgsl), each workgroup rounding its own x.

fn x8_round_block(b: u32, v: array<vec4<f32>, 8>) {
    var amax = 0.0;
    var sum = 0.0;
    for (var i = 0u; i < 8u; i++) {
        let a = abs(v[i]);
        amax = max(amax, max(max(a.x, a.y), max(a.z, a.w)));
        sum += v[i].x + v[i].y + v[i].z + v[i].w;
    }
    let d = amax / 127.0;
    let inv = select(0.0, 1.0 / d, d > 0.0);
    for (var i = 0u; i < 2u; i++) {
        xq[2u * b + i] = vec4<u32>(pack4xI8(vec4<i32>(round(v[4u * i] * inv))),
                                   pack4xI8(vec4<i32>(round(v[4u * i + 1u] * inv))),
                                   pack4xI8(vec4<i32>(round(v[4u * i + 2u] * inv))),
                                   pack4xI8(vec4<i32>(round(v[4u * i + 3u] * inv))));
    }
    xd[b] = vec2<f32>(d, sum);
}
