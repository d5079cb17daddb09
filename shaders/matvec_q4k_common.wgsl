// Shared by matvec_q4k.wgsl and matvec_q4k_sg.wgsl: the decode matvec for Q4_K weights read in
// 16-byte chunks (same contract as matvec.wgsl: K, N, TPR, WG, MODE overrides; y = W x, GeGLU
// over the gate and up halves, or gelu(W x) * B).
//
// A Q4_K block (144 bytes = 9 x vec4<u32>): word 0 holds d, dmin and the 12 scale bytes,
// words 1..8 the 128 quant bytes. Chunk c (of 8) of a block holds quant bytes 16c..16c+15,
// that is bytes l = 16h..16h+15 (h = c & 1) of the 32-byte group g = c >> 1: their low nibbles
// are weights 64g + l of sub-block 2g, their high nibbles weights 64g + 32 + l of sub-block
// 2g + 1 (ggml-common.h block_q4_K). Thread t of a row takes chunks t, t + TPR, ... so
// neighbouring threads read neighbouring 16 bytes and each load moves 32 weights; the block's
// header is the same 16 bytes for its 8 chunks (one broadcast load). Rows start on a 16-byte
// boundary (144 = 9 x 16), so every load is aligned.

override K: u32;
override N: u32;
override TPR: u32 = 16u;      // threads per row, power of two, <= WG
override WG: u32 = 64u;
override MODE: u32 = 0u;      // epilogue: 0 y = Wx; 1 GeGLU y = gelu(W[r]x) * W[N+r]x; 2 y = gelu(Wx) * B

@group(0) @binding(0) var<storage, read> W: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<storage, read> B: array<f32>;

//!include gelu

fn finish(row: u32, a: f32, b: f32) -> f32 {
    if (MODE == 1u) { return gelu_tanh(a) * b; }
    if (MODE == 2u) { return gelu_tanh(a) * B[row]; }
    return a;
}

fn byte_of(h: vec4<u32>, i: u32) -> u32 {      // scale byte i (0..11) of a block header
    return (h[1u + i / 4u] >> (8u * (i % 4u))) & 0xffu;
}

// (scale, min) of sub-block j (ggml's get_scale_min_k4)
fn scale_min(h: vec4<u32>, j: u32) -> vec2<f32> {
    if (j < 4u) { return vec2<f32>(f32(byte_of(h, j) & 63u), f32(byte_of(h, j + 4u) & 63u)); }
    let x = byte_of(h, j + 4u);
    return vec2<f32>(f32((x & 15u) | ((byte_of(h, j - 4u) >> 6u) << 4u)),
                     f32((x >> 4u) | ((byte_of(h, j) >> 6u) << 4u)));
}

// Chunk c of the row whose first block is word `rb`: its 32 weights . X
fn chunk_dot(rb: u32, c: u32) -> f32 {
    let b = c >> 3u;
    let ci = c & 7u;
    let g = ci >> 1u;
    let hdr = W[rb + 9u * b];
    let q = W[rb + 9u * b + 1u + ci];
    let xi = 64u * b + 16u * g + 4u * (ci & 1u);     // X (vec4) of the chunk's first low-nibble weight
    var lo = 0.0;
    var hi = 0.0;
    var xlo = vec4<f32>(0.0);
    var xhi = vec4<f32>(0.0);
    for (var i = 0u; i < 4u; i++) {
        let bytes = vec4<u32>(q[i], q[i] >> 8u, q[i] >> 16u, q[i] >> 24u);
        let a = X[xi + i];
        let z = X[xi + 8u + i];
        lo += dot(vec4<f32>(bytes & vec4<u32>(15u)), a);
        hi += dot(vec4<f32>((bytes >> vec4<u32>(4u)) & vec4<u32>(15u)), z);
        xlo += a;
        xhi += z;
    }
    let dm = unpack2x16float(hdr.x);
    let s0 = scale_min(hdr, 2u * g);
    let s1 = scale_min(hdr, 2u * g + 1u);
    let sum_lo = xlo.x + xlo.y + xlo.z + xlo.w;
    let sum_hi = xhi.x + xhi.y + xhi.z + xhi.w;
    return dm.x * (s0.x * lo + s1.x * hi) - dm.y * (s0.y * sum_lo + s1.y * sum_hi);
}

// Thread t's shares of row . X and, MODE 1, of the up row N rows further (else 0).
fn row_partials(row: u32, t: u32) -> vec2<f32> {
    let words = (K / 256u) * 9u;
    let rb = min(row, N - 1u) * words;
    var acc = vec2<f32>(0.0);
    for (var c = t; c < K / 32u; c += TPR) {
        acc.x += chunk_dot(rb, c);
        if (MODE == 1u) { acc.y += chunk_dot(rb + N * words, c); }
    }
    return acc;
}

var<workgroup> red: array<vec2<f32>, WG>;

// Sum the TPR partials of each row with a tree in shared memory; the row's thread 0 writes Y.
fn reduce_and_finish(lid: u32, t: u32, row: u32, acc: vec2<f32>) {
    red[lid] = acc;
    workgroupBarrier();
    for (var s = TPR / 2u; s > 0u; s >>= 1u) {
        if (t < s) { red[lid] += red[lid + s]; }
        workgroupBarrier();
    }
    if (t == 0u && row < N) { Y[row] = finish(row, red[lid].x, red[lid].y); }
}
