// Mixture of experts for a prefill chunk: the chunk's slots grouped by expert, then one tiled
// matmul per expert, so each expert's weights are read once per chunk instead of once per slot.
//
// Mirrors reference.forward ReferenceModel.moe's expert products (as moe.wgsl `experts` does
// slot by slot): Y[s, n] = sum_k W[IDS[s], n, k] * X[xrow(s), k] for the slots s = t*KSEL + j
// of the step's tokens; xrow = t (XPER = 1, one input row per token) or s (XPER = KSEL).
//
//   group:  one workgroup. Counts the slots of each expert (IDS[s] < E; larger ids, such as
//           the streamed-expert cache's NOT_HERE, are left out), and writes GRP:
//             GRP[e]            first row of expert e in the grouped order (GRP[E]: all rows)
//             GRP[E + 1 + e]    first tile of expert e (GRP[2E + 1]: all tiles)
//             GRP[2E + 2 + i]   the slot at grouped row i (within an expert, in any order:
//                               each slot's output depends only on its own row)
//           Dispatch (1).
//   matmul: the BM x BN tiles of matmul_tile.wgsl (BM rows of W by BN grouped slots, W
//           dequantized once per tile into shared memory); a workgroup's tile index (wid.y) finds its expert
//           by binary search over the first tiles. W holds experts E0 .. E0 + NE - 1 (an expert
//           tensor split over buffers, or the streamed cache): tiles of other experts return.
//           Dispatch (ceil(N / BM), ceil(T * KSEL / BN) + min(E, T * KSEL)), the most tiles
//           T tokens can need; those past GRP[2E + 1] return at once.
// S.n_tokens = T tokens (S: Step, the per-step uniform).

override E: u32 = 1u;
override KSEL: u32 = 1u;
override K: u32 = 4u;
override N: u32 = 1u;
override XPER: u32 = 1u;
override E0: u32 = 0u;
override NE: u32 = 1u;

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> S: Step;
@group(0) @binding(4) var<storage, read> IDS: array<u32>;
@group(0) @binding(5) var<storage, read_write> GRP: array<u32>;

//!include quants
//!include matmul_tile
//!include moe_tiles

var<workgroup> count: array<atomic<u32>, E>;
var<workgroup> first_row: array<u32, E>;

@compute @workgroup_size(256)
fn group(@builtin(local_invocation_index) lid: u32) {
    let n = S.n_tokens * KSEL;
    for (var e = lid; e < E; e += 256u) { atomicStore(&count[e], 0u); }
    workgroupBarrier();
    for (var s = lid; s < n; s += 256u) {
        let e = IDS[s];
        if (e < E) { atomicAdd(&count[e], 1u); }
    }
    workgroupBarrier();
    if (lid == 0u) {      // E is small (128): a serial prefix sum is cheaper than a parallel one's barriers
        var row = 0u;
        var tile = 0u;
        for (var e = 0u; e < E; e++) {
            let c = atomicLoad(&count[e]);
            first_row[e] = row;
            GRP[e] = row;
            GRP[E + 1u + e] = tile;
            row += c;
            tile += (c + BN - 1u) / BN;
            atomicStore(&count[e], 0u);         // from here on: each expert's fill cursor
        }
        GRP[E] = row;
        GRP[2u * E + 1u] = tile;
    }
    workgroupBarrier();
    for (var s = lid; s < n; s += 256u) {
        let e = IDS[s];
        if (e < E) { GRP[2u * E + 2u + first_row[e] + atomicAdd(&count[e], 1u)] = s; }
    }
}

var<private> r0: u32;
var<private> expert_row0: u32;

fn tile_w_base(i: u32) -> u32 { return (expert_row0 + min(r0 + i, N - 1u)) * (K / QK) * QB; }
fn tile_x_row(i: u32) -> u32 { return slot_x_row(i); }
fn tile_x(v: vec4<f32>) -> vec4<f32> { return v; }

@compute @workgroup_size(NT)
fn matmul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let e = tile_slots(wid.y, lid);
    if (e >= E || e < E0 || e >= E0 + NE) { return; }
    let rows = slot_rows;

    r0 = wid.x * BM;
    expert_row0 = (e - E0) * N;
    let acc = tile_product(lid, 0u, K / 4u);
    for (var j = 0u; j < TN; j++) {
        let i = tile_token(lid, j);
        var a = acc.lo;
        if (j >= 4u) { a = acc.hi; }
        if (i < rows) {
            let s = slot_at[i];
            for (var c = 0u; c < 4u; c++) {
                let r = r0 + tile_row(lid, c);
                if (r < N) { Y[s * N + r] = a[c][j % 4u]; }
            }
        }
    }
}
