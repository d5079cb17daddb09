// The grouped MoE matmul (moe_grouped.wgsl's `matmul`) for experts on int8 activations: the
// tiles of matmul_q8_tile.wgsl over the slots moe_grouped's `group` entry sorted by expert (made
// with the same BN). Y[s, n] = sum_k W[IDS[s], n, k] * X[xrow(s), k]; xrow = t (XPER = 1) or s
// (XPER = KSEL); X as quantize_q8.wgsl left it. W holds experts E0 .. E0 + NE - 1.
// Dispatch (ceil(N / BM), ceil(T * KSEL / BN) + min(E, T * KSEL)); tiles past the step's return.

override E: u32 = 1u;
override KSEL: u32 = 1u;
override K: u32 = 256u;
override N: u32 = 1u;
override XPER: u32 = 1u;
override E0: u32 = 0u;
override NE: u32 = 1u;

// binding 0: W, declared by the weight format's include (the prelude names it)
@group(0) @binding(1) var<storage, read> XQ: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> XS: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> Y: array<f32>;
@group(0) @binding(4) var<storage, read> GRP: array<u32>;

//!include matmul_q8_tile
//!include moe_tiles

var<private> r0: u32;
var<private> expert_row0: u32;

fn q8_w_row(i: u32) -> u32 { return expert_row0 + min(r0 + i, N - 1u); }
fn q8_x_row(i: u32) -> u32 { return slot_x_row(i); }

@compute @workgroup_size(NT)
fn matmul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let e = tile_slots(wid.y, lid);
    if (e >= E || e < E0 || e >= E0 + NE) { return; }
    r0 = wid.x * BM;
    expert_row0 = (e - E0) * N;
    let acc = q8_tile_product(lid, 0u, K);
    for (var h = 0u; h < TN / 4u; h++) {
        for (var g = 0u; g < TM / 4u; g++) {
            let a = q8_acc(acc, g, h);
            for (var j = 0u; j < 4u; j++) {
                let i = q8_tile_token(lid, h, j);
                if (i < slot_rows) {
                    let s = slot_at[i];
                    for (var c = 0u; c < 4u; c++) {
                        let r = r0 + q8_tile_row(lid, g, c);
                        if (r < N) { Y[s * N + r] = a[c][j]; }
                    }
                }
            }
        }
    }
}
