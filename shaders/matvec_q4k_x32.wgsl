// How the Q4_K chunk matvec (matvec_q4k_common.wgsl) meets an f32 x: nibbles become floats four at
// a time (unpack4x8unorm gives byte / 255: the 255 goes into the block's scales) and meet x through
// xv(); the blocks' min terms use sums of x over each run of 16 weights, made once per workgroup.

// Sums of X over each run of 16 weights, for the blocks' min terms (sized by an override of its own,
// not an expression of K: this file comes in the prelude, before the other overrides, and naga 29
// panics on an array sized by an override expression declared before an override).
override XR: u32 = 1u;                          // runs of 16 in x: K / 16
var<workgroup> xsum16: array<f32, XR>;

// Once per workgroup, after input_prologue(), in uniform control flow.
fn x_prepare(lid: u32) {
    for (var r = lid; r < XR; r += WG) {
        let v = xv(4u * r) + xv(4u * r + 1u) + xv(4u * r + 2u) + xv(4u * r + 3u);
        xsum16[r] = v.x + v.y + v.z + v.w;
    }
    workgroupBarrier();
}

// Chunk c of the row whose first block is word `rb`: its 32 weights . x.
fn chunk_dot(rb: u32, c: u32) -> f32 {
    let ch = load_chunk(rb, c);
    let q = ch.q;
    if (PROBE == 1u) { return f32(ch.hdr.x ^ q.x ^ q.y ^ q.z ^ q.w); }
    let xi = 64u * ch.b + 16u * ch.g + 4u * (ch.ci & 1u);     // X (vec4) of the chunk's first low-nibble weight
    var lo = 0.0;
    var hi = 0.0;
    for (var i = 0u; i < 4u; i++) {
        lo += dot(unpack4x8unorm(q[i] & 0x0f0f0f0fu), xv(xi + i));
        hi += dot(unpack4x8unorm((q[i] >> 4u) & 0x0f0f0f0fu), xv(xi + 8u + i));
    }
    let dm = unpack2x16float(ch.hdr.x);
    let sm = scale_min_pair(ch.hdr, ch.g);
    return 255.0 * dm.x * (sm.x * lo + sm.z * hi) - dm.y * (sm.y * xsum16[xi / 4u] + sm.w * xsum16[xi / 4u + 2u]);
}
