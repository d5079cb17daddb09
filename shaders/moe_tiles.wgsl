// Where a grouped MoE tile's slots are (moe_grouped.wgsl's GRP layout, which its `group` entry
// writes), shared by moe_grouped.wgsl and moe_grouped_q8.wgsl. The includer declares E, BN and
// GRP (array<u32>).

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

// The tile's first grouped row and its rows (<= BN) for expert e.
fn tile_rows(e: u32, tile: u32) -> vec2<u32> {
    let row0 = GRP[e] + (tile - GRP[E + 1u + e]) * BN;
    return vec2<u32>(row0, min(BN, GRP[e + 1u] - row0));
}
