// Prefill matmul: Y[t, r] = sum_k X[t, k] * W[r, k] for T tokens (Y = X W^T).
//
// Mirrors ggml_mul_mat with src0 = W (GGUF [N, K], quantized, any type in
// quants.wgsl) and src1 = X (f32 [T, K]); Y is f32 [T, N], token-major.
// K (multiple of QK) and N are override constants; T comes from the per-step
// uniform (S.n_tokens) so one pipeline serves every prompt length.
// Tiles: TILE rows x TILE tokens per workgroup of 256 threads (TILE = MATMUL_TILE = 64,
// from the prelude pyapp.gpu.kernels generates: its dispatch uses the same value),
// 16 weights of K per step; W is dequantized once per tile into shared memory (rows
// padded to 5 vec4 against bank conflicts). Each thread owns rows tx + 16i and tokens
// ty + 16j (i, j < 4): 16 accumulators, 16 dot products per 8 shared reads.
// Dispatch: (ceil(N / TILE), ceil(T / TILE)).

override K: u32;
override N: u32;
override LDY: u32 = 0u;    // row stride of Y (0: N); a row block of a split W writes its columns of a wider Y

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> S: Step;

const TILE: u32 = MATMUL_TILE;   // 16 threads x 4 each way: the loops below are written for 64
const STEP: u32 = 4u;      // vec4 groups of K per step
const PAD: u32 = 5u;       // shared row stride in vec4
var<workgroup> ws: array<vec4<f32>, TILE * PAD>;   // [TILE rows][PAD]
var<workgroup> xs: array<vec4<f32>, TILE * PAD>;   // [TILE tokens][PAD]

//!include quants

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let T = S.n_tokens;
    let r0 = wid.x * TILE;
    let t0 = wid.y * TILE;
    let tx = lid % 16u;
    let ty = lid / 16u;
    let lr = lid / STEP;          // row / token this thread loads
    let lg = lid % STEP;          // group within the K step
    let gpb = QK / 4u;
    let kg = K / 4u;
    let rowbase = min(r0 + lr, N - 1u) * (K / QK) * QB;
    var acc = array<vec4<f32>, 4>(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
    for (var k0 = 0u; k0 < kg; k0 += STEP) {
        let g = k0 + lg;
        var wv = vec4<f32>(0.0);
        var xv = vec4<f32>(0.0);
        if (g < kg && r0 + lr < N) { wv = dq4(rowbase + (g / gpb) * QB, g % gpb); }
        if (g < kg && t0 + lr < T) { xv = X[(t0 + lr) * kg + g]; }
        ws[lr * PAD + lg] = wv;
        xs[lr * PAD + lg] = xv;
        workgroupBarrier();
        for (var s = 0u; s < STEP; s++) {
            let w = array<vec4<f32>, 4>(ws[tx * PAD + s], ws[(tx + 16u) * PAD + s],
                                        ws[(tx + 32u) * PAD + s], ws[(tx + 48u) * PAD + s]);
            for (var j = 0u; j < 4u; j++) {
                let x = xs[(ty + 16u * j) * PAD + s];
                acc[j] += vec4<f32>(dot(w[0], x), dot(w[1], x), dot(w[2], x), dot(w[3], x));
            }
        }
        workgroupBarrier();
    }
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
