// Prefill matmul: Y[t, r] = sum_k X[t, k] * W[r, k] for T tokens (Y = X W^T).
//
// Mirrors ggml_mul_mat with src0 = W (GGUF [N, K], quantized, any type in
// quants.wgsl) and src1 = X (f32 [T, K]); Y is f32 [T, N], token-major.
// K (multiple of QK) and N are override constants; T comes from the per-step
// uniform (S.n_tokens) so one pipeline serves every prompt length.
// Tiles: TILE rows x TILE tokens per workgroup of 256 threads (TILE = MATMUL_TILE = 64,
// from the prelude pyapp.gpu.kernels generates: its dispatch uses the same value); the
// tile's product is matmul_tile.wgsl's.
// Dispatch: (ceil(N / TILE), ceil(T / TILE)).

override K: u32;
override N: u32;
override LDY: u32 = 0u;    // row stride of Y (0: N); a row block of a split W writes its columns of a wider Y

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> S: Step;

//!include quants
//!include matmul_tile_legacy

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let T = S.n_tokens;
    let r0 = wid.x * TILE;
    let t0 = wid.y * TILE;
    let tx = lid % 16u;
    let ty = lid / 16u;
    let lr = lid / STEP;          // row / token this thread loads
    let rowbase = min(r0 + lr, N - 1u) * (K / QK) * QB;
    let acc = tile_product(lid, rowbase, r0 + lr < N, t0 + lr, t0 + lr < T);
    let ldy = select(LDY, N, LDY == 0u);
    for (var j = 0u; j < 4u; j++) {
        let t = t0 + ty + 16u * j;
        if (t < T) {
            for (var i = 0u; i < 4u; i++) {
                let r = r0 + tx + 16u * i;
                if (r < N) { Y[t * ldy + r] = acc[j][i]; }
            }
        }
    }
}
