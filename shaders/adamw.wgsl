// AdamW with global-norm gradient clipping over one flat f32 buffer of every trainable value (all LoRA
// tensors of a run, each at a 64-float aligned offset, zeros between them: pyapp.train.gpu_optim.flat_layout).
// One update is three dispatches recorded once and replayed; the per-update numbers come from OP (written
// by the CPU before each submit), so nothing is read back inside an update.
//
// Mirrors pyapp.train.optim (clip_grad_norm, then AdamW.step; torch's clip_grad_norm_ and AdamW):
//   norm   = ||s G||_2,  factor = min(1, max_norm / (norm + 1e-6))   (max_norm <= 0: factor 1)
//   g      = s G[i] * factor              s = grad_scale (1, or 1 / micro-batches for summed gradients)
//   P[i]  *= decay                                  decay = 1 - lr * weight_decay
//   M[i]   = b1 M[i] + (1 - b1) g,   V[i] = b2 V[i] + (1 - b2) g^2
//   P[i]  -= step_size * M[i] / (sqrt(V[i]) / root_c2 + eps)
//                                                   step_size = lr / (1 - b1^t), root_c2 = sqrt(1 - b2^t)
// The CPU computes step_size, root_c2, decay, 1 - b1 and 1 - b2 in double precision (OptParams,
// pyapp.gpu.kernels.pack_opt_params): 1 - f32(0.999) in f32 would be 1.3e-5 off, relatively.
// Zero padding stays zero: g = 0 and P = 0 there, so M, V and P remain 0.
// A non-finite norm (an inf or a NaN gradient, or one above ~1e19 whose square overflows) sets factor 0 and `update` leaves P, M and V as they were
// (the update is skipped; NORM[0] tells the trainer why). G itself is only scaled in registers, not in
// place; with ZERO_GRADS the update clears G for the next accumulation instead.
//
// G, P, M, V: f32 [N]. PART: f32 [NP], one partial sum of squares of G per sumsq workgroup. NORM: f32 [2]
// = the norm before clipping (of s G) and the factor applied. OP: OptParams (uniform).
// Entry points, in this order (one compute pass):
//   sumsq:  PART[w] = sum of G[i]^2 over the elements workgroup w strides over (i = w WG + lid, step
//           NP WG): per-thread sums over a few elements, then a tree. Dispatch: NP workgroups.
//   norm:   NORM = (s sqrt(sum PART), factor). One workgroup. Dispatch: 1.
//   update: one thread per element. Dispatch: ceil(N / WG) workgroups (split above 65535).

override N: u32;             // floats in the flat buffers
override NP: u32;            // sumsq workgroups = partial sums (<= 1024 keeps the norm pass one workgroup)
override WG: u32 = 256u;
override ZERO_GRADS: bool = false;

@group(0) @binding(0) var<storage, read_write> P: array<f32>;
@group(0) @binding(1) var<storage, read_write> G: array<f32>;
@group(0) @binding(2) var<storage, read_write> M: array<f32>;
@group(0) @binding(3) var<storage, read_write> V: array<f32>;
@group(0) @binding(4) var<storage, read_write> PART: array<f32>;
@group(0) @binding(5) var<storage, read_write> NORM: array<f32>;
@group(0) @binding(6) var<uniform> OP: OptParams;

//!include workgroup_sum

@compute @workgroup_size(WG)
fn sumsq(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let w = wid.x + wid.y * nwg.x;
    if (w >= NP) { return; }               // the tail of a split dispatch: uniform per workgroup
    var acc = 0.0;
    for (var i = w * WG + lid; i < N; i += NP * WG) {
        let g = G[i];
        acc += g * g;
    }
    let total = workgroup_sum(lid, acc);
    if (lid == 0u) { PART[w] = total; }
}

fn finite(x: f32) -> bool {                // by the exponent bits: compilers may fold x == x away
    return (bitcast<u32>(x) & 0x7f800000u) != 0x7f800000u;
}

@compute @workgroup_size(WG)
fn norm(@builtin(local_invocation_index) lid: u32) {
    var acc = 0.0;
    for (var i = lid; i < NP; i += WG) { acc += PART[i]; }
    let total = workgroup_sum(lid, acc);
    if (lid == 0u) {
        let nrm = sqrt(total) * OP.grad_scale;
        var factor = 1.0;
        if (!finite(nrm)) {
            factor = 0.0;
        } else if (OP.max_norm > 0.0) {
            factor = min(1.0, OP.max_norm / (nrm + 1e-6));
        }
        NORM[0] = nrm;
        NORM[1] = factor;
    }
}

@compute @workgroup_size(WG)
fn update(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= N) { return; }
    let factor = NORM[1];
    let g = G[i] * OP.grad_scale * factor;
    if (ZERO_GRADS) { G[i] = 0.0; }
    if (factor == 0.0) { return; }         // non-finite gradients: skip the update
    let m = OP.b1 * M[i] + OP.one_minus_b1 * g;
    let v = OP.b2 * V[i] + OP.one_minus_b2 * g * g;
    M[i] = m;
    V[i] = v;
    P[i] = P[i] * OP.decay - OP.step_size * m / (sqrt(v) / OP.root_c2 + OP.eps);
}
