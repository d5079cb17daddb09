// Prefill matmul: Y[t, r] = sum_k X[t, k] * W[r, k] for T tokens (Y = X W^T).
//
// Mirrors ggml_mul_mat with src0 = W (GGUF [N, K], quantized, any type in
// quants.wgsl) and src1 = X (f32 [T, K]); Y is f32 [T, N], token-major.
// K (multiple of QK) and N are override constants; T comes from the uniform
// P.x so one pipeline serves every prompt length.
// Tiles: 32 rows x 32 tokens per workgroup of 256 threads, 32 weights of K per
// step; W is dequantized once per tile into shared memory. Each thread owns
// rows tx, tx+16 and tokens ty, ty+16 (strided: conflict-free shared reads).
// Dispatch: (ceil(N / 32), ceil(T / 32)).

override K: u32;
override N: u32;
override LDY: u32 = 0u;    // row stride of Y (0: N); a row block of a split W writes its columns of a wider Y

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> P: vec4<u32>;     // x = T

var<workgroup> ws: array<vec4<f32>, 256>;   // [32 rows][8 groups]
var<workgroup> xs: array<vec4<f32>, 256>;   // [32 tokens][8 groups]

//!include quants

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let T = P.x;
    let r0 = wid.x * 32u;
    let t0 = wid.y * 32u;
    let tx = lid % 16u;
    let ty = lid / 16u;
    let lr = lid / 8u;            // row / token this thread loads
    let lg = lid % 8u;            // group within the K step
    let gpb = QK / 4u;
    let kg = K / 4u;
    let rowbase = min(r0 + lr, N - 1u) * (K / QK) * QB;
    var acc = array<vec2<f32>, 2>(vec2<f32>(0.0), vec2<f32>(0.0));
    for (var k0 = 0u; k0 < kg; k0 += 8u) {
        let g = k0 + lg;
        var wv = vec4<f32>(0.0);
        var xv = vec4<f32>(0.0);
        if (g < kg && r0 + lr < N) { wv = dq4(rowbase + (g / gpb) * QB, g % gpb); }
        if (g < kg && t0 + lr < T) { xv = X[(t0 + lr) * kg + g]; }
        ws[lid] = wv;
        xs[lid] = xv;
        workgroupBarrier();
        for (var j = 0u; j < 8u; j++) {
            let w0 = ws[tx * 8u + j];
            let w1 = ws[(tx + 16u) * 8u + j];
            let x0 = xs[ty * 8u + j];
            let x1 = xs[(ty + 16u) * 8u + j];
            acc[0] += vec2<f32>(dot(w0, x0), dot(w1, x0));
            acc[1] += vec2<f32>(dot(w0, x1), dot(w1, x1));
        }
        workgroupBarrier();
    }
    let ldy = select(LDY, N, LDY == 0u);
    for (var b = 0u; b < 2u; b++) {
        let t = t0 + ty + 16u * b;
        if (t < T) {
            if (r0 + tx < N) { Y[t * ldy + r0 + tx] = acc[b].x; }
            if (r0 + tx + 16u < N) { Y[t * ldy + r0 + tx + 16u] = acc[b].y; }
        }
    }
}
