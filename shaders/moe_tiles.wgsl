// Where a grouped MoE tile's slots are (moe_grouped.wgsl's GRP layout, which its `group` entry
// writes), shared by moe_grouped.wgsl and moe_grouped_q8.wgsl. The includer declares E, KSEL, XPER,
// BN, NT and GRP (array<u32>).

var<workgroup> slot_at: array<u32, BN>;          // the slot of each grouped row of the tile
var<workgroup> tile_expert: u32;
var<private> slot_rows: u32;                     // grouped rows in the tile (<= BN)

// The expert owning tile `tile`: the last e whose first tile is <= tile (experts without slots share
// their first tile with the next one, so the last is the one with rows); E past the step's tiles.
fn expert_of_tile(tile: u32) -> u32 {
    var lo = 0u;
    var hi = E - 1u;
    while (lo < hi) {
        let mid = (lo + hi + 1u) / 2u;
        if (GRP[E + 1u + mid] <= tile) { lo = mid; } else { hi = mid - 1u; }
    }
    return select(lo, E, tile >= GRP[2u * E + 1u]);
}

// The expert of tile `tile` (E past the step's tiles), with slot_at and slot_rows filled (slot 0
// past the rows). Every thread calls it, from uniform control flow (it has barriers); the result is
// uniform (Dawn's analysis: it comes from workgroupUniformLoad).
fn tile_slots(tile: u32, lid: u32) -> u32 {
    if (lid == 0u) { tile_expert = expert_of_tile(tile); }
    let e = workgroupUniformLoad(&tile_expert);
    if (e >= E) { return E; }
    let row0 = GRP[e] + (tile - GRP[E + 1u + e]) * BN;
    slot_rows = min(BN, GRP[e + 1u] - row0);
    for (var i = lid; i < BN; i += NT) { slot_at[i] = select(0u, GRP[2u * E + 2u + row0 + i], i < slot_rows); }
    workgroupBarrier();
    return e;
}

// The X row of grouped row i: its token (XPER = 1, one input row a token) or its slot
fn slot_x_row(i: u32) -> u32 {
    let s = slot_at[i];
    return select(s / KSEL, s, XPER > 1u);
}
