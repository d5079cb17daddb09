// Softcap + cross-entropy, fused, over a vocabulary in chunks: the training loss and dloss/dz, never
// holding [T, vocab] (a chunk of the head's output at a time; the head is recomputed per chunk for the
// gradient pass, as the trainer does).
//
// Mirrors pyapp.reference.backward.cross_entropy, cross_entropy_backward and softcap_backward:
//   l = CAP tanh(z / CAP) (CAP 0: l = z);  loss = sum_t WT[t] (logsumexp(l[t]) - l[t, TGT[t]])
//   dz[t, v] = WT[t] (softmax(l[t])[v] - [v == TGT[t]]) (1 - tanh^2(z / CAP))
// WT[t] is the row's weight (mask[t + 1] / number of targets: row t predicts token t + 1; 0 for rows
// that count nothing) and TGT[t] its target id (pyapp.gpu.kernels.cross_entropy_targets packs both).
// Z: f32 [T, VC], the pre-softcap logits of vocabulary ids V0 .. V0 + VC - 1 (one chunk);
// ST: f32 [T, 4] running per-row statistics over the chunks seen: max logit, sum of exp(l - max), the
// target's logit. T = S.n_tokens (the per-step uniform). tanh's argument is clamped (gelu.wgsl).
// Entry points, in this order:
//   stats: fold one chunk into ST (FIRST: the first chunk starts it). Workgroup per row (two tree
//          reductions). Dispatch: T workgroups (split above 65535). Once per chunk.
//   loss:  LOSS[0] = the loss from ST, one workgroup. Dispatch: 1.
//   grad:  Z = dz in place for one chunk (after every chunk's stats). Thread per logit.
//          Dispatch: ceil(T * VC / WG) workgroups (split above 65535).

override VC: u32;
override V0: u32 = 0u;
override CAP: f32 = 0.0;
override FIRST: bool = false;
override WG: u32 = 256u;

@group(0) @binding(0) var<storage, read_write> Z: array<f32>;
@group(0) @binding(1) var<storage, read> TGT: array<u32>;
@group(0) @binding(2) var<storage, read> WT: array<f32>;
@group(0) @binding(3) var<storage, read_write> ST: array<f32>;
@group(0) @binding(4) var<storage, read_write> LOSS: array<f32>;
@group(0) @binding(5) var<uniform> S: Step;

//!include gelu
//!include workgroup_sum

fn capped(z: f32) -> f32 {
    if (CAP > 0.0) { return CAP * tanh_safe(z / CAP); }
    return z;
}

@compute @workgroup_size(WG)
fn stats(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let t = wid.x + wid.y * nwg.x;
    if (t >= S.n_tokens) { return; }       // uniform per workgroup: barriers stay legal
    let base = t * VC;
    var m = -3.0e38;
    for (var v = lid; v < VC; v += WG) { m = max(m, capped(Z[base + v])); }
    m = workgroup_max(lid, m);
    var s = 0.0;
    for (var v = lid; v < VC; v += WG) { s += exp(capped(Z[base + v]) - m); }
    s = workgroup_sum(lid, s);
    if (lid == 0u) {
        let tgt = TGT[t];
        if (tgt >= V0 && tgt - V0 < VC) {
            ST[4u * t + 2u] = capped(Z[base + tgt - V0]);
        } else if (FIRST) {
            ST[4u * t + 2u] = 0.0;
        }
        if (FIRST) {
            ST[4u * t] = m;
            ST[4u * t + 1u] = s;
        } else {
            let m0 = ST[4u * t];
            let m1 = max(m0, m);
            ST[4u * t + 1u] = ST[4u * t + 1u] * exp(m0 - m1) + s * exp(m - m1);
            ST[4u * t] = m1;
        }
    }
}

@compute @workgroup_size(WG)
fn loss(@builtin(local_invocation_index) lid: u32) {
    var acc = 0.0;
    for (var t = lid; t < S.n_tokens; t += WG) {
        let w = WT[t];
        if (w != 0.0) { acc += w * (ST[4u * t] + log(ST[4u * t + 1u]) - ST[4u * t + 2u]); }
    }
    let total = workgroup_sum(lid, acc);
    if (lid == 0u) { LOSS[0] = total; }
}

@compute @workgroup_size(WG)
fn grad(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = gid.x + gid.y * nwg.x * WG;
    if (id >= S.n_tokens * VC) { return; }
    let t = id / VC;
    let v = id % VC;
    let i = t * VC + v;
    let w = WT[t];
    if (w == 0.0) { Z[i] = 0.0; return; }
    let z = Z[i];
    let l = capped(z);
    var d = exp(l - ST[4u * t]) / ST[4u * t + 1u];
    if (V0 + v == TGT[t]) { d -= 1.0; }
    d *= w;
    if (CAP > 0.0) {
        let th = tanh_safe(z / CAP);
        d *= 1.0 - th * th;
    }
    Z[i] = d;
}
