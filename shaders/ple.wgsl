// Gemma 4 per-layer embeddings (PLE): combine the token's per-layer embedding with
// a projection of the hidden state, per layer.
//
// Mirrors reference.forward per_layer_inputs (Ollama's PerLayerProjector):
//   O[l, t, :] = (rms_norm(P[t, l, :] * PSCALE) * NW + EMB[t, l, :]) * (1 / sqrt 2)
// P: f32 [T, L, PD] = x @ per_layer_model_proj^T, PSCALE = 1/sqrt(hidden);
// EMB: f32 [T, L, PD] per_layer_token_embd rows already times sqrt(PD);
// NW: f32 [PD] per_layer_proj_norm. O is layer-major [L, TMAX, PD] so each layer's
// slice is contiguous for the PLE gate. S.n_tokens = T (S: Step, the per-step uniform).
// One workgroup per (t, l). Dispatch (L, T).

override L: u32;
override PD: u32;
override TMAX: u32;
override PSCALE: f32 = 1.0;
override EPS: f32 = 1e-6;
override WG: u32 = 64u;

@group(0) @binding(0) var<storage, read> P: array<f32>;
@group(0) @binding(1) var<storage, read> EMB: array<f32>;
@group(0) @binding(2) var<storage, read> NW: array<f32>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;
@group(0) @binding(4) var<uniform> S: Step;

//!include workgroup_sum

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let l = wid.x;
    let t = wid.y;
    if (t >= S.n_tokens) { return; }
    let src = (t * L + l) * PD;
    var ss = 0.0;
    for (var i = lid; i < PD; i += WG) {
        let v = P[src + i] * PSCALE;
        ss += v * v;
    }
    let inv = inverseSqrt(workgroup_sum(lid, ss) / f32(PD) + EPS);
    let dst = (l * TMAX + t) * PD;
    for (var i = lid; i < PD; i += WG) {
        O[dst + i] = (P[src + i] * PSCALE * inv * NW[i] + EMB[src + i]) * 0.7071067811865476;
    }
}
