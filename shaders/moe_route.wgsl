// The MoE router: which KSEL of the E experts each token takes, and their weights.
//
// Mirrors reference.forward ReferenceModel.moe's router (Ollama's gemma4 TextMoE):
//   probs = softmax(logits[t, :E]); the KSEL largest (lowest id on ties) -> IDS[t, k];
//   WTS[t, k] = their probs renormalized to sum 1.
// From the logits LOG [T, E] the router matvec wrote; one workgroup of WG threads per token,
// dispatch (T). S.n_tokens = T tokens (S: Step, the per-step uniform).

override E: u32 = 1u;
override KSEL: u32 = 1u;
override WG: u32 = 128u;

@group(0) @binding(3) var<uniform> S: Step;
@group(0) @binding(4) var<storage, read_write> IDS: array<u32>;
@group(0) @binding(5) var<storage, read_write> WTS: array<f32>;
@group(0) @binding(6) var<storage, read> LOG: array<f32>;

var<workgroup> lv: array<f32, E>;
var<workgroup> rank: array<u32, E>;

//!include workgroup_sum

// Each thread ranks its experts (the number ahead: a larger logit, or an equal one with a lower
// id, the reference's stable sort); ranks below KSEL are chosen, weighted by their softmax
// renormalized over the chosen. (A single thread per token took ~290 us a layer on an H100 for
// E = 128; KSEL rounds of a tree argmax ~63 us.)
@compute @workgroup_size(WG)
fn route(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.x;
    if (t >= S.n_tokens) { return; }         // uniform per workgroup: the barriers stay legal
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
