// Elementwise ops over N = T * D floats (T = S.n_tokens tokens of the per-step uniform
// Step, D per token), one thread per float. Dispatch: ceil(T * D / 64) workgroups
// (split above 65535).
//   geglu:   O = gelu_tanh(A) * B          (Gemma MLP; reference gelu_tanh)
//   geglu_halves: O[r, f] = gelu_tanh(A[r, f]) * A[r, D + f] for rows r of [gate | up] (2 D floats):
//            a fused gate_up projection's output, T * RPT rows (RPT = experts per token, or 1)
//   softcap: A = tanh(A / CAP) * CAP        (final logits; reference softcap)
//   add:     A = A + B                      (residuals)
//   add_bias: A[t, i] = A[t, i] + B[i]      (a linear's bias, B of D floats)
//   mul:     A = A * B                      (PLE gating)
//   scale:   A = A * SCALE * (B[0] if SCALE_BY_B)   (embedding sqrt(hidden), layer_output_scale)
// tanh's argument is clamped (gelu.wgsl's tanh_safe): some drivers overflow to NaN.

override D: u32;
override CAP: f32 = 30.0;
override SCALE: f32 = 1.0;
override SCALE_BY_B: bool = false;
override RPT: u32 = 1u;      // geglu_halves: rows per token

@group(0) @binding(0) var<storage, read_write> A: array<f32>;
@group(0) @binding(1) var<storage, read> B: array<f32>;
@group(0) @binding(2) var<uniform> S: Step;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;

//!include thread_index

//!include gelu

@compute @workgroup_size(64)
fn geglu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= S.n_tokens * D) { return; }
    O[i] = gelu_tanh(A[i]) * B[i];
}

@compute @workgroup_size(64)
fn geglu_halves(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= S.n_tokens * RPT * D) { return; }
    let r = i / D;
    let f = i % D;
    O[i] = gelu_tanh(A[r * 2u * D + f]) * A[r * 2u * D + D + f];
}

@compute @workgroup_size(64)
fn softcap(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= S.n_tokens * D) { return; }
    A[i] = tanh_safe(A[i] / CAP) * CAP;
}

@compute @workgroup_size(64)
fn add(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= S.n_tokens * D) { return; }
    A[i] += B[i];
}

@compute @workgroup_size(64)
fn add_bias(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= S.n_tokens * D) { return; }
    A[i] += B[i % D];
}

@compute @workgroup_size(64)
fn mul(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= S.n_tokens * D) { return; }
    A[i] *= B[i];
}

@compute @workgroup_size(64)
fn scale(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= S.n_tokens * D) { return; }
    var s = SCALE;
    if (SCALE_BY_B) { s *= B[0]; }
    A[i] *= s;
}
