// Prefill matmul: Y[t, r] = sum_k X[t, k] * W[r, k] for T tokens (Y = X W^T).
//
// Mirrors ggml_mul_mat with src0 = W (GGUF [N, K], quantized, any type in
// quants.wgsl) and src1 = X (f32 [T, K]); Y is f32 [T, N], token-major.
// K (multiple of QK), N, Y's row stride and the slices of K are read from D at run time, so that one
// pipeline serves every shape (each pipeline is a compile; a model has a dozen shapes, and an override per
// shape made each its own); T comes from the per-step uniform (S.n_tokens).
// Tiles: BM rows x BN tokens per workgroup of NT threads (matmul_tile.wgsl; its
// shape comes from the prelude pyapp.gpu.kernels generates, and the dispatch uses the same values).
// CLAMP: a clippable linear of the image and audio encoders, Y = clamp(clamp(X, CB[0], CB[1]) W^T,
// CB[2], CB[3]) (CB: its in_min, in_max, out_min, out_max), in this dispatch rather than two more.
// Split over K (SPLIT > 1: matrices of few rows, whose tiles alone leave the GPU's SMs idle, as
// matmul_q8.wgsl): workgroup z takes the weights z K / SPLIT .. (z + 1) K / SPLIT - 1 and writes its partial
// sums to Y[z, t, r] (Y f32 [SPLIT, T, N]); sum_slices.wgsl adds them, or the residual add that reads them
// (norm.wgsl XSPLIT: K.matmul's summed False); no CLAMP then.
// Dispatch: (ceil(N / BM), ceil(T / BN), SPLIT).

override CLAMP: bool = false;

struct Dims {
    k: u32,
    n: u32,
    ldy: u32,     // row stride of Y (0: n); a row block of a split W writes its columns of a wider Y
    split: u32,   // slices of K (k / split a multiple of BK; ldy 0 where it is above 1)
}

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> S: Step;
@group(0) @binding(4) var<storage, read> CB: array<f32>;     // CLAMP: the bounds (else any buffer)
@group(0) @binding(5) var<uniform> D: Dims;

//!include quants
//!include matmul_tile

var<private> K: u32;      // D.k, D.n where the includes read them
var<private> N: u32;
var<private> r0: u32;
var<private> t0: u32;
var<private> t_last: u32;

fn tile_w_base(i: u32) -> u32 { return min(r0 + i, N - 1u) * (K / QK) * QB; }
fn tile_x_row(i: u32) -> u32 { return min(t0 + i, t_last); }
fn tile_x(v: vec4<f32>) -> vec4<f32> {
    if (CLAMP) { return min(max(v, vec4<f32>(CB[0])), vec4<f32>(CB[1])); }
    return v;
}
fn tile_y(v: f32) -> f32 {
    if (CLAMP) { return min(max(v, CB[2]), CB[3]); }
    return v;
}

@compute @workgroup_size(NT)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let T = S.n_tokens;
    if (wid.y * BN >= T) { return; }   // the plan is sized for its longest step: tiles past this one's tokens
    K = D.k;
    N = D.n;
    r0 = wid.x * BM;
    t0 = wid.y * BN;
    t_last = T - 1u;
    let q_slice = D.k / 4u / D.split;   // vec4 groups of K a slice (from D: uniform control flow for the barriers)
    let acc = tile_product(lid, wid.z * q_slice, (wid.z + 1u) * q_slice);
    let ldy = select(D.ldy, N, D.ldy == 0u);
    let y0 = wid.z * T * N;              // this slice's partial sums (0 unsplit)
    for (var j = 0u; j < TN; j++) {
        let t = t0 + tile_token(lid, j);
        var a = acc.lo;
        if (j >= 4u) { a = acc.hi; }
        if (t < T) {
            for (var i = 0u; i < 4u; i++) {
                let r = r0 + tile_row(lid, i);
                if (r < N) { Y[y0 + t * ldy + r] = tile_y(a[i][j % 4u]); }
            }
        }
    }
}
