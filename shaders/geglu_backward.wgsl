// Backward of the GeGLU activations (elementwise.wgsl's geglu_halves, the PLE gate's gelu * input).
//
// Mirrors pyapp.reference.backward.geglu_backward / gelu_tanh_backward:
//   y = gelu_tanh(g) * u:   dg = dy * u * gelu'(g),  du = dy * gelu(g)
//   gelu'(g) = (1 + t) / 2 + g / 2 (1 - t^2) c (1 + 3 * 0.044715 g^2),  t = tanh(c (g + 0.044715 g^3))
// T = S.n_tokens tokens of the per-step uniform, RPT rows a token (1; or the experts per token).
// Entry points, a thread per output float (dispatch ceil(T * RPT * D / 64), split above 65535):
//   halves: GU [rows, 2D] = [gate | up] (a fused gate_up projection's output, kept by the forward),
//           DY [rows, D]  ->  DGU [rows, 2D] = [dgate | dup] (what matmul_dx of the fused weight reads)
//   times:  G [rows, D] (the gate's pre-activation), M [rows, D] (the other factor, e.g. the PLE input,
//           which takes no gradient), DY [rows, D]  ->  DG [rows, D] = dy * m * gelu'(g)

override D: u32;
override RPT: u32 = 1u;

@group(0) @binding(0) var<storage, read> GU: array<f32>;
@group(0) @binding(1) var<storage, read> M: array<f32>;
@group(0) @binding(2) var<storage, read> DY: array<f32>;
@group(0) @binding(3) var<storage, read_write> DGU: array<f32>;
@group(0) @binding(4) var<uniform> S: Step;

//!include gelu

fn gelu_grad(g: f32) -> f32 {
    let c = 0.7978845608028654;
    let t = tanh_safe(c * (g + 0.044715 * g * g * g));
    return 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * g * g);
}

@compute @workgroup_size(64)
fn halves(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = gid.x + gid.y * nwg.x * 64u;
    if (id >= S.n_tokens * RPT * D) { return; }
    let r = id / D;
    let f = id % D;
    let g = GU[r * 2u * D + f];
    let u = GU[r * 2u * D + D + f];
    let dy = DY[id];
    DGU[r * 2u * D + f] = dy * u * gelu_grad(g);
    DGU[r * 2u * D + D + f] = dy * gelu_tanh(g);
}

@compute @workgroup_size(64)
fn times(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = gid.x + gid.y * nwg.x * 64u;
    if (id >= S.n_tokens * RPT * D) { return; }
    DGU[id] = DY[id] * M[id] * gelu_grad(GU[id]);
}
