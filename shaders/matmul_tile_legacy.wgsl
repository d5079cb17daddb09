// One 64 x 64 tile of a prefill matmul, shared by matmul.wgsl and moe_grouped.wgsl: 64 rows of W
// (rows r0 + i, GGUF-encoded, dequantized once per tile into shared memory, rows padded to 5 vec4
// against bank conflicts) times 64 rows of X (whichever rows the caller maps them to), 16
// weights of K per step. Each of the 256 threads owns W rows tx + 16i and X rows ty + 16j
// (i, j < 4): 16 accumulators, 16 dot products per 8 shared reads.
// The includer declares K, W, X (array<vec4<f32>>) and the quants prelude (QK, QB, dq4), and
// calls tile_product from uniform control flow (it has barriers).

const TILE: u32 = MATMUL_TILE;   // 16 threads x 4 each way: the loops below are written for 64
const STEP: u32 = 4u;      // vec4 groups of K per step
const PAD: u32 = 5u;       // shared row stride in vec4
var<workgroup> ws: array<vec4<f32>, TILE * PAD>;   // [TILE rows of W][PAD]
var<workgroup> xs: array<vec4<f32>, TILE * PAD>;   // [TILE rows of X][PAD]

// Thread lid loads W row `rowbase` (when w_ok) and X row x_row (when x_ok): row lid / STEP of
// the tile. Returns acc[j][i] = W row (tx + 16i) . X row (ty + 16j), tx = lid % 16, ty = lid / 16.
fn tile_product(lid: u32, rowbase: u32, w_ok: bool, x_row: u32, x_ok: bool) -> array<vec4<f32>, 4> {
    let tx = lid % 16u;
    let ty = lid / 16u;
    let lr = lid / STEP;
    let lg = lid % STEP;
    let gpb = QK / 4u;
    let kg = K / 4u;
    var acc = array<vec4<f32>, 4>(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
    for (var k0 = 0u; k0 < kg; k0 += STEP) {
        let g = k0 + lg;
        var wv = vec4<f32>(0.0);
        var xv = vec4<f32>(0.0);
        if (g < kg && w_ok) { wv = dq4(rowbase + (g / gpb) * QB, g % gpb); }
        if (g < kg && x_ok) { xv = X[x_row * kg + g]; }
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
    return acc;
}
