// One register-tiled tile of a prefill matmul, shared by matmul.wgsl and moe_grouped.wgsl:
// BM rows of W (GGUF-encoded, dequantized once per tile) times BN rows of X (whichever rows the
// includer maps them to), BK weights of K per step. Each of the NT threads owns TM rows x TN
// tokens of the tile (TM * TN accumulators): per k it reads TM / 4 + TN / 4 vec4 from shared
// memory for TM * TN multiply-adds, so shared-memory reads stop bounding the FMA rate.
//
// Shared tiles are k-major ([k][4 rows] as vec4) so the inner loop is an outer product; their rows
// are padded by one vec4 against bank conflicts on the transposing stores. Loading is in units
// of 4 rows x 4 k (one dq4 or X vec4 per row, transposed in registers): the first WU units are W's,
// the next XU X's, spread over the threads. The next step's units are loaded into registers while
// the current step computes (their global reads' latency hides behind the FMAs).
//
// Tile shape constants MM_BM, MM_BN, MM_BK, MM_TM, MM_TN come from the prelude
// (pyapp.gpu.kernels.matmul_tile_prelude: its dispatch uses the same values).
// The includer declares K, W, X (array<vec4<f32>>), the quants prelude (QK, QB, dq4) and
//   fn tile_w_base(i: u32) -> u32   byte offset of the W row for tile row i (any valid row past N)
//   fn tile_x_row(i: u32) -> u32    X row (in vec4 rows of K) for tile token i (any valid row past the end)
// and calls tile_product from uniform control flow (it has barriers). Accumulator
// acc[(4a + i) * (TN / 4) + b][j] is tile row tile_row(lid, a, i), token tile_token(lid, b, j).

const BM: u32 = MM_BM;
const BN: u32 = MM_BN;
const BK: u32 = MM_BK;
const TM: u32 = MM_TM;
const TN: u32 = MM_TN;
const TXN: u32 = BM / TM;              // threads along the rows
const TYN: u32 = BN / TN;              // threads along the tokens
const NT: u32 = TXN * TYN;             // threads per workgroup
const KQ: u32 = BK / 4u;               // vec4 groups of K per step
const GMP: u32 = BM / 4u + 1u;         // padded shared row lengths, in vec4
const GNP: u32 = BN / 4u + 1u;
const WU: u32 = BM / 4u * KQ;          // load units per step: W's, then X's
const XU: u32 = BN / 4u * KQ;
const UM: u32 = (WU + XU + NT - 1u) / NT;   // units per thread
const TACC: u32 = TM * TN / 4u;

var<workgroup> ws: array<vec4<f32>, BK * GMP>;   // [k][rows 4g .. 4g + 3]
var<workgroup> xs: array<vec4<f32>, BK * GNP>;   // [k][tokens 4h .. 4h + 3]

fn tile_row(lid: u32, a: u32, i: u32) -> u32 { return 4u * (lid % TXN + a * TXN) + i; }
fn tile_token(lid: u32, b: u32, j: u32) -> u32 { return 4u * (lid / TXN + b * TYN) + j; }

// Unit u's 4 rows (W: byte offsets; X: row indices), for every step.
fn unit_rows(u: u32) -> vec4<u32> {
    var r = vec4<u32>(0u);
    if (u < WU) {
        let g = u / KQ;
        for (var i = 0u; i < 4u; i++) { r[i] = tile_w_base(4u * g + i); }
    } else if (u < WU + XU) {
        let h = (u - WU) / KQ;
        for (var i = 0u; i < 4u; i++) { r[i] = tile_x_row(4u * h + i); }
    }
    return r;
}

// Unit u's 4 rows at K's vec4 group gk (zeros past K).
fn load_unit(u: u32, rows: vec4<u32>, gk: u32) -> array<vec4<f32>, 4> {
    var v = array<vec4<f32>, 4>(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
    let kg = K / 4u;
    if (gk >= kg || u >= WU + XU) { return v; }
    if (u < WU) {
        let gpb = QK / 4u;
        for (var i = 0u; i < 4u; i++) { v[i] = dq4(rows[i] + (gk / gpb) * QB, gk % gpb); }
    } else {
        for (var i = 0u; i < 4u; i++) { v[i] = X[rows[i] * kg + gk]; }
    }
    return v;
}

// Unit u's values transposed into the k-major shared tiles.
fn store_unit(u: u32, v: array<vec4<f32>, 4>) {
    let kq = u % KQ;
    if (u < WU) {
        let g = u / KQ;
        for (var c = 0u; c < 4u; c++) { ws[(4u * kq + c) * GMP + g] = vec4<f32>(v[0][c], v[1][c], v[2][c], v[3][c]); }
    } else if (u < WU + XU) {
        let h = (u - WU) / KQ;
        for (var c = 0u; c < 4u; c++) { xs[(4u * kq + c) * GNP + h] = vec4<f32>(v[0][c], v[1][c], v[2][c], v[3][c]); }
    }
}

fn tile_product(lid: u32) -> array<vec4<f32>, TACC> {
    let tx = lid % TXN;
    let ty = lid / TXN;
    var rows: array<vec4<u32>, UM>;
    var next: array<array<vec4<f32>, 4>, UM>;
    for (var m = 0u; m < UM; m++) {
        let u = lid + m * NT;
        rows[m] = unit_rows(u);
        next[m] = load_unit(u, rows[m], u % KQ);
    }
    var acc: array<vec4<f32>, TACC>;
    for (var k0 = 0u; k0 < K / 4u; k0 += KQ) {
        for (var m = 0u; m < UM; m++) { store_unit(lid + m * NT, next[m]); }
        workgroupBarrier();
        for (var m = 0u; m < UM; m++) {
            let u = lid + m * NT;
            next[m] = load_unit(u, rows[m], k0 + KQ + u % KQ);
        }
        for (var k = 0u; k < BK; k++) {
            var wv: array<vec4<f32>, TM / 4u>;
            var xv: array<vec4<f32>, TN / 4u>;
            for (var a = 0u; a < TM / 4u; a++) { wv[a] = ws[k * GMP + tx + a * TXN]; }
            for (var b = 0u; b < TN / 4u; b++) { xv[b] = xs[k * GNP + ty + b * TYN]; }
            for (var a = 0u; a < TM / 4u; a++) {
                for (var i = 0u; i < 4u; i++) {
                    for (var b = 0u; b < TN / 4u; b++) {
                        let ai = (4u * a + i) * (TN / 4u) + b;
                        acc[ai] = fma(vec4<f32>(wv[a][i]), xv[b], acc[ai]);
                    }
                }
            }
        }
        workgroupBarrier();
    }
    return acc;
}
