// Shared by matvec.wgsl and matvec_sg.wgsl: sizes, bindings, each thread's partial dot
// products, the shared-memory reduction and the epilogue (MODE 0: y = Wx; 1: GeGLU over the
// gate and up halves of W; 2: gelu(Wx) * B).
// x is read through xv() after input_prologue() (matvec_input.wgsl: from X;
// matvec_input_residual.wgsl: built from a pending residual add; matvec_input_norm.wgsl: a row
// normed by every workgroup), which the prelude supplies;
// so is tail_workgroup() (matvec_tail_none.wgsl, or matvec_tail_route.wgsl: one workgroup more
// that routes a MoE token), store_row() and round_rows() (matvec_out_y.wgsl, or matvec_out_q8.wgsl: the
// rows also rounded to int8 for the next matvec), dot32() and x_prepare() (a no-op for f32 x; x8_round.wgsl's for the int8
// units of quants_dot_x8.wgsl, or x8_stored.wgsl's).

override K: u32;
override N: u32;
override TPR: u32 = 64u;      // threads per row, power of two, <= WG
override WG: u32 = 256u;
override MODE: u32 = 0u;      // epilogue: 0 y = Wx; 1 GeGLU y = gelu(W[r]x) * W[N+r]x; 2 y = gelu(Wx) * B

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<storage, read> B: array<f32>;

var<workgroup> red: array<f32, WG>;
var<workgroup> red2: array<f32, WG>;

//!include gelu

// The epilogue: what row `row` of Y gets from its dot product(s).
fn finish(row: u32, a: f32, b: f32) -> f32 {
    if (MODE == 1u) { return gelu_tanh(a) * b; }
    if (MODE == 2u) { return gelu_tanh(a) * B[row]; }
    return a;
}

//!include quants
//!include quants_dot

// This thread's shares of row . X and, MODE 1, of the up row N rows further (else 0): 32-weight units
// (dot32: scales decoded once per unit, but a thread reads 32 weights in a row) for long rows, else
// 4-weight groups (neighbouring threads read neighbouring words: better coalescing, all TPR threads
// busy on short rows).
override UNITS: bool = false;

// Unit u of the row at rowbase and, MODE 1, of its up row.
fn unit_pair(rowbase: u32, u: u32) -> vec2<f32> {
    var v = vec2<f32>(dot32(rowbase, u), 0.0);
    if (MODE == 1u) { v.y = dot32(rowbase + N * (K / QK) * QB, u); }
    return v;
}

// A decode matvec is bound by memory latency (a few warps per SM), not bandwidth: the units go four,
// then two a round, so that their loads (and the up row's) are in flight together, not one after another
// (as matvec_q4k_common.wgsl's chunks).
fn unit_partials(rowbase: u32, t: u32) -> vec2<f32> {
    let n = K / 32u;
    var acc = vec2<f32>(0.0);
    var u = t;
    for (; u + 3u * TPR < n; u += 4u * TPR) {
        acc += unit_pair(rowbase, u) + unit_pair(rowbase, u + TPR) + unit_pair(rowbase, u + 2u * TPR)
             + unit_pair(rowbase, u + 3u * TPR);
    }
    if (u + TPR < n) {
        acc += unit_pair(rowbase, u) + unit_pair(rowbase, u + TPR);
        u += 2u * TPR;
    }
    if (u < n) { acc += unit_pair(rowbase, u); }
    return acc;
}

fn group_dot(rowbase: u32, t: u32) -> f32 {
    let gpb = QK / 4u;
    var acc = 0.0;
    for (var g = t; g < K / 4u; g += TPR) { acc += dot(dq4(rowbase + (g / gpb) * QB, g % gpb), xv(g)); }
    return acc;
}

fn row_partials(row: u32, t: u32) -> vec2<f32> {
    let rowbase = min(row, N - 1u) * (K / QK) * QB;
    if (UNITS) { return unit_partials(rowbase, t); }
    var acc = vec2<f32>(group_dot(rowbase, t), 0.0);
    if (MODE == 1u) { acc.y = group_dot(rowbase + N * (K / QK) * QB, t); }
    return acc;
}

// Sum the TPR partials of each row with a tree in shared memory; the row's thread 0 stores it.
fn reduce_and_finish(lid: u32, t: u32, row: u32, acc: vec2<f32>) {
    red[lid] = acc.x;
    red2[lid] = acc.y;
    workgroupBarrier();
    for (var s = TPR / 2u; s > 0u; s >>= 1u) {
        if (t < s) {
            red[lid] += red[lid + s];
            red2[lid] += red2[lid + s];
        }
        workgroupBarrier();
    }
    if (t == 0u && row < N) { store_row(row, lid, finish(row, red[lid], red2[lid])); }
}
