// Decode expert matvec for Q4_K weights in 16-byte chunks (matvec_q4k_common.wgsl), the chosen
// experts of every token (same contract as moe.wgsl experts): Y[s, n] = W[IDS[s], n] . x for slots
// s = t*KSEL + j, x = X row t (XPER 1: the token's input) or s (XPER KSEL: one row a slot).
// MODE 1: W is [E, 2N, K], each expert's gate rows then its up rows, Y = gelu(gate x) * (up x).
// W holds experts E0 .. E0 + NE - 1 (a big expert tensor is split over buffers): slots routed
// elsewhere are not written. Dispatch (ceil(N / (WG / TPR)), T * KSEL).

// (declared before the include: naga 29 panics on overrides declared after a workgroup array
// sized by an earlier one)
override KSEL: u32 = 1u;
override XPER: u32 = 1u;
override E0: u32 = 0u;
override NE: u32 = 1u;

//!include matvec_q4k_common

@group(0) @binding(10) var<storage, read> IDS: array<u32>;
@group(0) @binding(11) var<uniform> S: Step;

//!include moe_slot

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
        @builtin(subgroup_size) sg: u32) {
    let slot = wid.y;
    if (slot >= S.n_tokens * KSEL) { return; }        // uniform per workgroup
    let r = expert_row(slot, wid, lid);
    x_prepare(lid);
    let rows_per_expert = select(N, 2u * N, MODE == 1u);
    var acc = vec2<f32>(0.0);
    if (r.here) {
        acc = row_partials_at(((r.e - E0) * rows_per_expert + min(r.row, N - 1u)) * row_words(), r.t);
    }
    if (sg < TPR) {                                    // a subgroup narrower than a row: the tree
        acc = row_tree_sum(lid, r.t, acc);
    } else {
        for (var m = TPR / 2u; m > 0u; m >>= 1u) { acc += subgroupShuffleXor(acc, m); }
    }
    if (r.t == 0u && r.row < N && r.here) { Y[slot * N + r.row] = finish(r.row, acc.x, acc.y); }
}
