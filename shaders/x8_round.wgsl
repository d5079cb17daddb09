// x rounded to int8 by each workgroup of a decode kernel, into workgroup memory, by the prefill's rule
// (q8_block.wgsl): xq holds the codes (16 a vec4, byte i of word w = element 4 w + i: dot4I8Packed's
// order), xd each block's (d, exact sum of its x) for the min terms; the int8 kernels read them through
// x8q() and x8d() (x8_stored.wgsl's read the codes x's producer stored). The including kernel reads x
// through xv() (after its input_prologue()); used by matvec_q4k_x8.wgsl, matvec.wgsl's int8 units
// (quants_dot_x8.wgsl) and moe_x8.wgsl (as llama.cpp's MMVQ rounds x to q8_1 once per matvec).

// (sized by overrides of their own, not expressions of K: this file may come in a prelude, before the
// kernel's overrides, and naga 29 panics on an array sized by an override expression declared before
// an override)
override XB: u32 = 1u;                          // blocks of 32 in x: K / 32
override XR: u32 = 1u;                          // 2 XB
var<workgroup> xq: array<vec4<u32>, XR>;
var<workgroup> xd: array<vec2<f32>, XB>;

//!include q8_block

fn x8q(i: u32) -> vec4<u32> { return xq[i]; }      // codes 16 i .. 16 i + 15
fn x8d(b: u32) -> vec2<f32> { return xd[b]; }      // block b's (d, sum)

// Once per workgroup, in uniform control flow: one thread a block of 32, its 8 loads issued together.
fn x_prepare(lid: u32) {
    for (var b = lid; b < XB; b += WG) {
        var v: array<vec4<f32>, 8>;
        for (var i = 0u; i < 8u; i++) { v[i] = xv(8u * b + i); }
        let r = q8_block(v);
        xq[2u * b] = vec4<u32>(r.q[0], r.q[1], r.q[2], r.q[3]);
        xq[2u * b + 1u] = vec4<u32>(r.q[4], r.q[5], r.q[6], r.q[7]);
        xd[b] = r.ds;
    }
    workgroupBarrier();
}
