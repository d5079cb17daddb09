// Int8 prefill matmul: Y[t, r] = sum_k X[t, k] * W[r, k] with X quantized to int8 per 32 by
// quantize_q8.wgsl (the tile: matmul_q8_tile.wgsl; W, declared by the weight format's include,
// Q4_K, Q4_0, Q5_0 or Q8_0). Mirrors ggml_mul_mat with src0 = W (GGUF [N, K]) and src1 = X as
// llama.cpp's MMQ computes it; Y is f32 [T, N], token-major.
// Split over K (SPLIT > 1; as MMQ's stream-k, for matrices of few rows and long ones, whose tiles alone
// leave the GPU's SMs idle): workgroup z takes the weights z K / SPLIT .. (z + 1) K / SPLIT - 1 and
// writes its partial sums to Y[z, t, r] (Y f32 [SPLIT, T, N]); sum_slices.wgsl adds them, or the residual
// add that reads them (norm.wgsl XSPLIT: K.matmul_q8's summed False).
// Dispatch: (ceil(N / BM), ceil(T / BN), SPLIT); T = S.n_tokens.

// K (a multiple of the format's Q8_W_ALIGN), N, Y's row stride and the slices of K are read from D at run
// time: one pipeline serves every shape of a weight format (matmul.wgsl says why).
struct Dims {
    k: u32,
    n: u32,
    ldy: u32,     // row stride of Y (0: n); a row block of a split W writes its columns of a wider Y
    split: u32,   // slices of K (k / split a multiple of 64; ldy 0 where it is above 1)
}

// binding 0: W, declared by the weight format's include (the prelude names it)
@group(0) @binding(1) var<storage, read> XQ: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> XS: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> Y: array<f32>;
@group(0) @binding(4) var<uniform> S: Step;
@group(0) @binding(5) var<uniform> D: Dims;

//!include matmul_q8_tile

var<private> K: u32;      // D.k, D.n where the includes read them
var<private> N: u32;
var<private> r0: u32;
var<private> t0: u32;
var<private> t_last: u32;

fn q8_w_row(i: u32) -> u32 { return min(r0 + i, N - 1u); }
fn q8_x_row(i: u32) -> u32 { return min(t0 + i, t_last); }

@compute @workgroup_size(NT)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let T = S.n_tokens;
    if (wid.y * BN >= T) { return; }     // the plan is sized for its longest step: tiles past this one's tokens
    K = D.k;
    N = D.n;
    r0 = wid.x * BM;
    t0 = wid.y * BN;
    t_last = T - 1u;
    let k_slice = D.k / D.split;         // (from D: uniform control flow for the barriers)
    let acc = q8_tile_product(lid, wid.z * k_slice, (wid.z + 1u) * k_slice);
    let ldy = select(D.ldy, N, D.ldy == 0u);
    let y0 = wid.z * T * N;              // this slice's partial sums (0 unsplit)
    for (var h = 0u; h < TN / 4u; h++) {
        for (var g = 0u; g < TM / 4u; g++) {
            let a = q8_acc(acc, g, h);
            for (var j = 0u; j < 4u; j++) {
                let t = t0 + q8_tile_token(lid, h, j);
                if (t < T) {
                    for (var i = 0u; i < 4u; i++) {
                        let r = r0 + q8_tile_row(lid, g, i);
                        if (r < N) { Y[y0 + t * ldy + r] = a[i][j]; }
                    }
                }
            }
        }
    }
}
