// Shared by matvec_q4k.wgsl and matvec_q4k_sg.wgsl: the decode matvec for Q4_K weights read in
// 16-byte chunks (same contract as matvec.wgsl: K, N, TPR, WG, MODE overrides; y = W x, GeGLU
// over the gate and up halves, or gelu(W x) * B).
//
// Q4_K rows are read in q4k_chunk.wgsl's 16-byte chunks: thread t of a row takes chunks t, t + TPR,
// ... so neighbouring threads read neighbouring 16 bytes and each load moves 32 weights; the block's
// header is the same 16 bytes for its 8 chunks (one broadcast load).
// x is read through xv() after input_prologue() (matvec_input.wgsl: from X;
// matvec_input_residual.wgsl: built from a pending residual add; matvec_input_norm.wgsl: a row
// normed by every workgroup), which the prelude supplies;
// so is tail_workgroup() (matvec_tail_none.wgsl, or matvec_tail_route.wgsl: one workgroup more
// that routes a MoE token), store_row() and round_rows() for the kernels that store whole rows
// (matvec_out_y.wgsl, or matvec_out_q8.wgsl: also rounded to int8 for the next matvec), and how a chunk meets x: x_prepare() once per workgroup, then
// chunk_dot() (matvec_q4k_x32.wgsl: f32 x; matvec_q4k_x8.wgsl: x rounded to int8 per 32 in workgroup
// memory, integer dot products).

override K: u32;
override N: u32;
override TPR: u32 = 16u;      // threads per row, power of two, <= WG
override WG: u32 = 64u;
override MODE: u32 = 0u;      // epilogue: 0 y = Wx; 1 GeGLU y = gelu(W[r]x) * W[N+r]x; 2 y = gelu(Wx) * B
override PROBE: u32 = 0u;     // bench/matvec_sweep.py --probe 1: the loads alone (a bandwidth probe, wrong sums)

@group(0) @binding(0) var<storage, read> W: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<storage, read> B: array<f32>;

//!include gelu
//!include q4k_chunk

fn finish(row: u32, a: f32, b: f32) -> f32 {
    if (MODE == 1u) { return gelu_tanh(a) * b; }
    if (MODE == 2u) { return gelu_tanh(a) * B[row]; }
    return a;
}

// Chunk c of the row at rb . X and, MODE 1, of the up row N rows further (else 0).
fn chunk_pair(rb: u32, c: u32) -> vec2<f32> {
    var v = vec2<f32>(chunk_dot(rb, c), 0.0);
    if (MODE == 1u) { v.y = chunk_dot(rb + N * (K / 256u) * 9u, c); }
    return v;
}

// Words of a row of W.
fn row_words() -> u32 { return (K / 256u) * 9u; }

// Thread t's shares of row . X and, MODE 1, of the up row N rows further (else 0).
fn row_partials(row: u32, t: u32) -> vec2<f32> {
    return row_partials_at(min(row, N - 1u) * row_words(), t);
}

// row_partials for the row whose first word is rb. A decode matvec is bound by memory latency (a
// few warps per SM), not bandwidth: four, then two chunks a round, so that their loads are in
// flight together rather than one after another.
fn row_partials_at(rb: u32, t: u32) -> vec2<f32> {
    let n = K / 32u;
    var acc = vec2<f32>(0.0);
    var c = t;
    for (; c + 3u * TPR < n; c += 4u * TPR) {
        acc += chunk_pair(rb, c) + chunk_pair(rb, c + TPR) + chunk_pair(rb, c + 2u * TPR) + chunk_pair(rb, c + 3u * TPR);
    }
    if (c + TPR < n) {
        acc += chunk_pair(rb, c) + chunk_pair(rb, c + TPR);
        c += 2u * TPR;
    }
    if (c < n) { acc += chunk_pair(rb, c); }
    return acc;
}

var<workgroup> red: array<vec2<f32>, WG>;

// The sum of each row's TPR partials (a tree in shared memory), meaningful in the row's thread 0.
// Uniform control flow only.
fn row_tree_sum(lid: u32, t: u32, acc: vec2<f32>) -> vec2<f32> {
    red[lid] = acc;
    workgroupBarrier();
    for (var s = TPR / 2u; s > 0u; s >>= 1u) {
        if (t < s) { red[lid] += red[lid + s]; }
        workgroupBarrier();
    }
    return red[lid];
}
