// attention_rows: what the prefill attention tiles share (attention_prefill.wgsl, attention_prefill_wide.wgsl):
// which keys a query row sees. A workgroup takes a block of rows: row r of a block whose first token is t0
// is query head kvh * GH + r % GH of token t0 + r / GH, at position p = S.pos0 + t0 + r / GH. It sees keys
// j <= p and (WINDOW == 0 or p - j < WINDOW); with ALL_KEYS, every key of the step (j < S.pos0 +
// S.n_tokens, bidirectional: an image encoder's patches); with BLOCKS, also the KL[t] keys after p (an
// image's soft tokens see their whole image on the sliding layers of 26B-A4B and 31B; the window bounds
// only the keys before p). The includer includes attention_shape first.

override WINDOW: u32 = 0u;
override ALL_KEYS: bool = false;
override BLOCKS: bool = false;   // a query also sees the KL[t] keys after its own (the rest of an image's block)
override GH: u32 = 1u;           // query heads per KV head (H / HKV)

@group(0) @binding(4) var<uniform> S: Step;
@group(0) @binding(5) var<storage, read> KL: array<u32>;   // BLOCKS: keys after its own each row of the step sees

// Score of row r against key j, or NEG where the row's query may not see it (or has no token).
fn masked(s: f32, r: u32, j: u32, t0: u32) -> f32 {
    let t = t0 + r / GH;
    let pos = S.pos0 + t;
    let ahead = (ALL_KEYS && j < S.pos0 + S.n_tokens) || (BLOCKS && j <= pos + KL[min(t, S.n_tokens - 1u)]);
    let ok = t < S.n_tokens && (j <= pos || ahead) && (WINDOW == 0u || j > pos || pos - j < WINDOW);
    return select(NEG, s, ok);
}

// (first, last) key any of a block's `rows` rows sees; the block's first token t0 is in the step.
fn key_range(t0: u32, rows: u32) -> vec2<u32> {
    let t_last = min(t0 + rows / GH, S.n_tokens) - 1u;
    var hi = select(S.pos0 + t_last, S.pos0 + S.n_tokens - 1u, ALL_KEYS);
    if (BLOCKS) { hi = max(hi, S.pos0 + t_last + KL[t_last]); }
    let p0 = S.pos0 + t0;
    var lo = 0u;
    if (WINDOW > 0u && p0 + 1u > WINDOW) { lo = p0 + 1u - WINDOW; }
    return vec2<u32>(lo, hi);
}
