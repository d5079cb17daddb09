// The MoE router's choice for one token (reference.forward ReferenceModel.moe, Ollama's gemma4
// TextMoE): probs = softmax(LOG[t, :E]); the KSEL largest (lowest id on ties) -> IDS[t, k];
// WTS[t, k] = their probs renormalized to sum 1. route_token(t, lid) runs on the WG threads of a
// workgroup (the includer declares `override WG`, a power of two) in uniform control flow.
// Included by moe_route.wgsl (a dispatch of its own) and matvec_tail_route.wgsl (one workgroup
// more in the next matvec's dispatch).

override E: u32 = 1u;
override KSEL: u32 = 1u;

@group(0) @binding(10) var<storage, read_write> IDS: array<u32>;
@group(0) @binding(11) var<storage, read_write> WTS: array<f32>;
@group(0) @binding(12) var<storage, read> LOG: array<f32>;

var<workgroup> lv: array<f32, E>;
var<workgroup> rank: array<u32, E>;

//!include workgroup_sum

// Each thread ranks its experts (the number ahead: a larger logit, or an equal one with a lower
// id, the reference's stable sort); ranks below KSEL are chosen, weighted by their softmax
// renormalized over the chosen. (A single thread per token took ~290 us a layer on an H100 for
// E = 128; KSEL rounds of a tree argmax ~63 us.)
fn route_token(t: u32, lid: u32) {
    var mine = -3.4e38;
    for (var e = lid; e < E; e += WG) {
        lv[e] = LOG[t * E + e];
        mine = max(mine, lv[e]);
    }
    let m = workgroup_max(lid, mine);        // its first barrier also publishes lv
    var part_sum = 0.0;
    for (var e = lid; e < E; e += WG) {
        let v = lv[e];
        var r = 0u;
        for (var o = 0u; o < E; o++) { r += select(0u, 1u, lv[o] > v || (lv[o] == v && o < e)); }
        rank[e] = r;
        if (r < KSEL) { part_sum += exp(v - m); }
    }
    let chosen = workgroup_sum(lid, part_sum);
    for (var e = lid; e < E; e += WG) {
        let r = rank[e];
        if (r < KSEL) {
            IDS[t * KSEL + r] = e;
            WTS[t * KSEL + r] = exp(lv[e] - m) / chosen;
        }
    }
}
