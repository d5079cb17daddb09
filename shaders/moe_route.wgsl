// The MoE router's choice (route_choice.wgsl) for each token of a step, from the logits LOG [T, E]
// the router matvec wrote: one workgroup of WG threads per token, dispatch (T).
// S.n_tokens = T tokens (S: Step, the per-step uniform).

override WG: u32 = 128u;

@group(0) @binding(3) var<uniform> S: Step;

//!include route_choice

@compute @workgroup_size(WG)
fn route(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.x;
    if (t >= S.n_tokens) { return; }         // uniform per workgroup: the barriers stay legal
    route_token(t, lid);
}
