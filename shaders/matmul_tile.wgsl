// One tile of a prefill matmul, shared by matmul.wgsl and moe_grouped.wgsl: BM rows of W
// (GGUF-encoded, dequantized once per tile) times BN rows of X (whichever rows the includer maps
// them to), BK weights of K per step. Each thread owns 4 rows x TN tokens (TN = 4 or 8): per k it
// reads one vec4 of W and TN / 4 of X from shared memory for 4 TN multiply-adds (an outer product).
//
// Shared tiles are k-major ([k][4 rows] as vec4), rows padded by one vec4 against bank conflicts
// on the transposing stores. Loading is in units of 4 rows x 4 k (four dq4 or X vec4 reads,
// transposed in registers): thread lid loads W unit lid and X unit (lid + NT / 2) % NT, where
// those exist, and stores each as whole vec4 (stores by component into a shared vec4 from
// neighbouring invocations are a data race in WGSL: Metal's and D3D's compilers may write the whole
// vector, gpuweb#2112; a Q4_K path that stored one row's 32-weight sub-block a thread did so, and
// went). The next step's units are read into registers while the current step computes, so their
// global reads' latency hides behind the multiply-adds.
//
// Tile shape constants MM_BM, MM_BN, MM_BK and MM_TN come from the prelude
// (pyapp.gpu.kernels.matmul_prelude: its dispatch uses the same values), and two types:
// MM_S, the shared tiles' scalar, and MM_M, the multiply-adds'. f32 / f32 is the portable tile;
// with shader-f16, f16 tiles halve the shared memory a step reads (and holds), and f16 multiply-adds
// run two to an instruction: those sum one step's BK products in f16 and fold them into the f32
// accumulators at the step's end (MM_FOLD), so rounding never builds up over K. The includer declares K,
// W, X (array<vec4<f32>>), the quants prelude (QK, QB, dq4) and
//   fn tile_w_base(i: u32) -> u32   byte offset of the W row for tile row i (any valid row past N)
//   fn tile_x_row(i: u32) -> u32    X row (in vec4 rows of K) for tile token i (any valid row past the end)
//   fn tile_x(v: vec4<f32>) -> vec4<f32>   what the product takes of 4 values of X (v, or v clamped)
// and calls tile_product(lid, q_lo, q_hi) from uniform control flow (it has barriers) for K's vec4 groups
// q_lo .. q_hi - 1 (whole steps of BK weights: all of K, or a slice of it). Column i of the result's
// lo (tokens j < 4) and hi (j >= 4, TN = 8) is tile row tile_row(lid, i); component j % 4 is tile
// token tile_token(lid, j).

const BM: u32 = MM_BM;
const BN: u32 = MM_BN;
const BK: u32 = MM_BK;
const TN: u32 = MM_TN;
const TXN: u32 = BM / 4u;              // threads along the rows
const TYN: u32 = BN / TN;              // threads along the tokens
const NT: u32 = TXN * TYN;             // threads per workgroup
const KQ: u32 = BK / 4u;               // vec4 groups of K per step
const GN: u32 = BN / 4u;               // groups of 4 tokens
const GMP: u32 = TXN + 1u;             // padded shared row lengths, in vec4
const GNP: u32 = GN + 1u;
const WU: u32 = TXN * KQ;              // load units per step (<= NT each: MatmulTile checks)
const XU: u32 = GN * KQ;

const MM_FOLD: bool = MM_F16_MATH;

struct TileAcc {
    lo: mat4x4<f32>,     // tokens j < 4
    hi: mat4x4<f32>,     // tokens 4 <= j < 8 (TN = 8)
}

var<workgroup> ws: array<vec4<MM_S>, BK * GMP>;   // [k][rows 4g .. 4g + 3]
var<workgroup> xs: array<vec4<MM_S>, BK * GNP>;   // [k][tokens 4h .. 4h + 3]

fn tile_row(lid: u32, i: u32) -> u32 { return 4u * (lid % TXN) + i; }
fn tile_token(lid: u32, j: u32) -> u32 { return 4u * (lid / TXN + (j / 4u) * TYN) + j % 4u; }

// W unit (rows at byte offsets wb) at K's vec4 group gk, as columns (zeros past K or without a unit).
fn load_w(ok: bool, wb: vec4<u32>, gk: u32) -> mat4x4<f32> {
    if (!ok || gk >= K / 4u) { return mat4x4<f32>(); }
    let o = (gk / (QK / 4u)) * QB;
    let i = gk % (QK / 4u);
    return mat4x4<f32>(dq4(wb.x + o, i), dq4(wb.y + o, i), dq4(wb.z + o, i), dq4(wb.w + o, i));
}

fn load_x(ok: bool, xr: vec4<u32>, gk: u32) -> mat4x4<f32> {
    let kg = K / 4u;
    if (!ok || gk >= kg) { return mat4x4<f32>(); }
    return mat4x4<f32>(tile_x(X[xr.x * kg + gk]), tile_x(X[xr.y * kg + gk]), tile_x(X[xr.z * kg + gk]),
                       tile_x(X[xr.w * kg + gk]));
}

fn tile_product(lid: u32, q_lo: u32, q_hi: u32) -> TileAcc {
    let tx = lid % TXN;
    let ty = lid / TXN;
    let wu = lid;                      // this thread's W unit: rows 4 wg .., K group wkq of each step
    let has_w = wu < WU;
    let wkq = wu % KQ;
    let wg = min(wu / KQ, TXN - 1u);
    let xu = (lid + NT / 2u) % NT;     // its X unit
    let has_x = xu < XU;
    let xkq = xu % KQ;
    let xh = min(xu / KQ, GN - 1u);
    let wb = vec4<u32>(tile_w_base(4u * wg), tile_w_base(4u * wg + 1u), tile_w_base(4u * wg + 2u),
                       tile_w_base(4u * wg + 3u));
    let xr = vec4<u32>(tile_x_row(4u * xh), tile_x_row(4u * xh + 1u), tile_x_row(4u * xh + 2u),
                       tile_x_row(4u * xh + 3u));
    var wn = load_w(has_w, wb, q_lo + wkq);
    var xn = load_x(has_x, xr, q_lo + xkq);
    var acc = mat4x4<f32>();
    var acc2 = mat4x4<f32>();
    var part = mat4x4<MM_M>();         // the sums in MM_M: the whole K's, or (MM_FOLD) this step's
    var part2 = mat4x4<MM_M>();
    for (var k0 = q_lo; k0 < q_hi; k0 += KQ) {
        if (has_w) {
            let t = transpose(wn);
            for (var c = 0u; c < 4u; c++) { ws[(4u * wkq + c) * GMP + wg] = vec4<MM_S>(t[c]); }
        }
        if (has_x) {
            let t = transpose(xn);
            for (var c = 0u; c < 4u; c++) { xs[(4u * xkq + c) * GNP + xh] = vec4<MM_S>(t[c]); }
        }
        workgroupBarrier();
        wn = load_w(has_w, wb, k0 + KQ + wkq);
        xn = load_x(has_x, xr, k0 + KQ + xkq);
        for (var k = 0u; k < BK; k++) {
            let w = vec4<MM_M>(ws[k * GMP + tx]);
            let x = vec4<MM_M>(xs[k * GNP + ty]);
            part[0] = fma(vec4<MM_M>(w.x), x, part[0]);
            part[1] = fma(vec4<MM_M>(w.y), x, part[1]);
            part[2] = fma(vec4<MM_M>(w.z), x, part[2]);
            part[3] = fma(vec4<MM_M>(w.w), x, part[3]);
            if (TN == 8u) {
                let x2 = vec4<MM_M>(xs[k * GNP + ty + TYN]);
                part2[0] = fma(vec4<MM_M>(w.x), x2, part2[0]);
                part2[1] = fma(vec4<MM_M>(w.y), x2, part2[1]);
                part2[2] = fma(vec4<MM_M>(w.z), x2, part2[2]);
                part2[3] = fma(vec4<MM_M>(w.w), x2, part2[3]);
            }
        }
        if (MM_FOLD) {
            acc += mat4x4<f32>(part);
            acc2 += mat4x4<f32>(part2);
            part = mat4x4<MM_M>();
            part2 = mat4x4<MM_M>();
        }
        workgroupBarrier();
    }
    if (!MM_FOLD) {
        acc = mat4x4<f32>(part);
        acc2 = mat4x4<f32>(part2);
    }
    return TileAcc(acc, acc2);
}
