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

// This thread's share of row . X: 32-weight units (dot32: scales decoded once per unit, but a
// thread reads 32 weights in a row) for long rows, else 4-weight groups (neighbouring threads
// read neighbouring words: better coalescing, all TPR threads busy on short rows).
override UNITS: bool = false;

fn partial_dot(rowbase: u32, t: u32) -> f32 {
    var acc = 0.0;
    if (UNITS) {
        for (var u = t; u < K / 32u; u += TPR) { acc += dot32(rowbase, u); }
    } else {
        let gpb = QK / 4u;
        for (var g = t; g < K / 4u; g += TPR) { acc += dot(dq4(rowbase + (g / gpb) * QB, g % gpb), xv(g)); }
    }
    return acc;
}

// Thread t's shares of row . X and, MODE 1, of the up row N rows further (else 0).
fn row_partials(row: u32, t: u32) -> vec2<f32> {
    let rowbase = min(row, N - 1u) * (K / QK) * QB;
    var acc = vec2<f32>(partial_dot(rowbase, t), 0.0);
    if (MODE == 1u) { acc.y = partial_dot(rowbase + N * (K / QK) * QB, t); }
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
