// attention_key_slices: a prefill attention tile over slices of the keys (KSPLIT > 1: where a step's tiles
// make too few workgroups for the GPU, as flash-decoding splits a decode's keys). Workgroup z of the
// dispatch's third dimension takes the z-th of KSPLIT runs of whole key tiles and writes its rows
// unnormalized, with their running max and sum, to P; attention_combine.wgsl merges the slices.
// P: [slice][t * H + head] rows of HD / 4 + 1 vec4: the output, then (max, sum, 0, 0). The includer
// includes attention_shape and declares P (its own element type) and S.

override KSPLIT: u32 = 1u;

// Slices this step takes: KSPLIT only in a prompt's first step (pos0 0), whose causal blocks are uneven (the
// last walks the whole step's keys, the first one tile) and few; in later steps every block walks about as
// many keys, the SMs stay as busy unsplit and the slices measured slower (bench/RESULTS.md, 2026-11-28):
// workgroups of slices past the first return at once, the first writes O itself and the merge does nothing.
fn slices_now() -> u32 {
    return select(1u, KSPLIT, S.pos0 == 0u);
}

// Where slice z's output row `row` (t * H + head) starts in P, in vec4; its (max, sum) are at vec4 HD / 4.
fn slice_row(z: u32, row: u32) -> u32 {
    return (z * S.n_tokens * H + row) * (HD / 4u + 1u);
}

// (first, last) key of slice z's tiles (of slices_now()) of `tile` keys over the keys a block sees (keys: first, last): the
// keys themselves unsplit; first > last where the slice has no tile.
fn slice_keys(keys: vec2<u32>, tile: u32, z: u32) -> vec2<u32> {
    let n = slices_now();
    let per = ((keys.y - keys.x) / tile + n) / n;               // tiles a slice: ceil(tiles / n)
    let lo = keys.x + z * per * tile;
    return vec2<u32>(lo, min(keys.y, lo + per * tile - 1u));
}
