// x rounded to int8 by each workgroup of a decode kernel, into workgroup memory, by quantize_q8.wgsl's
// rule (pyapp.reference.quants.quantize_activations_q8): per block of 32, d = max |x| / 127,
// q = round(x / d), 0 for an all-zero block; xq holds the codes (16 a vec4, byte i of word w = element
// 4 w + i: dot4I8Packed's order), xd each block's (d, exact sum of its x) for the min terms. The
// including kernel reads x through xv() (after its input_prologue()); used by matvec_q4k_x8.wgsl,
// matvec_x8.wgsl and moe_x8.wgsl (as llama.cpp's MMVQ rounds x to q8_1 once per matvec).

// (sized by overrides of their own, not expressions of K: this file may come in a prelude, before the
// kernel's overrides, and naga 29 panics on an array sized by an override expression declared before
// an override)
override XB: u32 = 1u;                          // blocks of 32 in x: K / 32
override XR: u32 = 1u;                          // 2 XB
var<workgroup> xq: array<vec4<u32>, XR>;
var<workgroup> xd: array<vec2<f32>, XB>;

// Once per workgroup, in uniform control flow: one thread a block of 32, its 8 loads issued together.
fn x_prepare(lid: u32) {
    for (var b = lid; b < XB; b += WG) {
        var v: array<vec4<f32>, 8>;
        for (var i = 0u; i < 8u; i++) { v[i] = xv(8u * b + i); }
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
    workgroupBarrier();
}
