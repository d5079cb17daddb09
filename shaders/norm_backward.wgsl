// Backward of RMSNorm (norm.wgsl) and of NeoX RoPE (rope.wgsl), for the training backward.
//
// Mirrors pyapp.reference.backward.rms_norm_backward and rope_neox_backward:
//   y = x / rms(x) [* w]:   dx = (g - x_hat * mean(g * x_hat)) / rms,  g = dy [* w],  x_hat = x / rms
//   y = rope(x):            dx = rope(dy) by the opposite angle (a rotation per pair: its transpose)
// X: f32 [T * RPT, D] (the norm's forward input; RPT rows per token: 1 for hidden states, the heads
// for the per-head q/k/v norms). DY: the output gradient, same layout; with DYC > 0, in the KV cache's
// layout instead: row (t, h) at (h * DYC + t) * D (attention_backward's dK / dV of the k/v norms). Wt: f32 [D] (unused when HAS_W
// is false). DX: written, or added into with ACC (a residual stream's gradient sums several paths).
// Token t = row / RPT sits at position S.pos0 + t; T = S.n_tokens (the per-step uniform).
// Entry points:
//   main:  dX (+)= rms_norm_backward(X, Wt, DY * SCALE) (SCALE: a constant factor of the forward, norm.wgsl's
//          SCALE: the MoE router input's 1/sqrt(hidden)); with NROT > 0, DY is the gradient of rope(norm(X) * Wt)
//          (norm.wgsl's norm_rope, the q/k norms) and is rotated back first: pairs (i, i + NROT/2),
//          theta = pos * BASE^(-2i/NROT) / FF[i]; dims >= NROT (partial rotation) pass through.
//          One workgroup per row, tree reductions. Dispatch: T * RPT workgroups (split above 65535).
//   rope:  DX = rope(DX) by -theta in place, [T, RPT heads, D], pairs as above; thread per (row, pair).
//          Dispatch: ceil(T * RPT * NROT / 2 / WG) workgroups (split above 65535).

override D: u32;
override RPT: u32 = 1u;
override EPS: f32 = 1e-6;
override HAS_W: bool = true;
override SCALE: f32 = 1.0;
override ACC: bool = false;
override NROT: u32 = 0u;
override BASE: f32 = 10000.0;
override HAS_FF: bool = false;
override DYC: u32 = 0u;
override WG: u32 = 256u;

@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read> DY: array<f32>;
@group(0) @binding(2) var<storage, read> Wt: array<f32>;
@group(0) @binding(3) var<storage, read_write> DX: array<f32>;
@group(0) @binding(4) var<storage, read> FF: array<f32>;
@group(0) @binding(5) var<uniform> S: Step;

//!include workgroup_sum
//!include sincos

// The rotation angle of pair j (< NROT / 2) at position pos.
fn angle(j: u32, pos: f32) -> f32 {
    var inv_freq = pow(BASE, -2.0 * f32(j) / f32(NROT));
    if (HAS_FF) { inv_freq /= FF[j]; }
    return pos * inv_freq;
}

// Where row `row`'s gradient starts in DY.
fn dy_row(row: u32) -> u32 {
    if (DYC == 0u) { return row * D; }
    return ((row % RPT) * DYC + row / RPT) * D;
}

// g_i = (DY rotated back when NROT > 0)_i * Wt_i for element i of the row whose gradient is at `base`.
fn grad_in(base: u32, i: u32, pos: f32) -> f32 {
    var d = DY[base + i];
    if (i < NROT) {
        let half = NROT / 2u;
        let j = i % half;
        let a = angle(j, pos);
        let d0 = DY[base + j];
        let d1 = DY[base + j + half];
        let sc = sin_cos(a);
        d = select(d1 * sc.y - d0 * sc.x, d0 * sc.y + d1 * sc.x, i < half);
    }
    return select(d, d * Wt[i], HAS_W) * SCALE;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= S.n_tokens * RPT) { return; }   // uniform per workgroup: barriers stay legal
    let base = row * D;
    let dbase = dy_row(row);
    let pos = f32(S.pos0 + row / RPT);
    var ss = 0.0;
    var gx = 0.0;
    for (var i = lid; i < D; i += WG) {
        let x = X[base + i];
        ss += x * x;
        gx += grad_in(dbase, i, pos) * x;
    }
    let inv = inverseSqrt(workgroup_sum(lid, ss) / f32(D) + EPS);
    let c = workgroup_sum(lid, gx) * inv * inv / f32(D);      // mean(g * x_hat) / rms
    for (var i = lid; i < D; i += WG) {
        let d = inv * (grad_in(dbase, i, pos) - X[base + i] * c);
        if (ACC) { DX[base + i] += d; } else { DX[base + i] = d; }
    }
}

@compute @workgroup_size(WG)
fn rope(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let half = NROT / 2u;
    let id = gid.x + gid.y * nwg.x * WG;
    if (id >= S.n_tokens * RPT * half) { return; }
    let j = id % half;
    let row = id / half;
    let a = angle(j, f32(S.pos0 + row / RPT));
    let i = row * D + j;
    let d0 = DX[i];
    let d1 = DX[i + half];
    let sc = sin_cos(a);
    DX[i] = d0 * sc.y + d1 * sc.x;
    DX[i + half] = d1 * sc.y - d0 * sc.x;
}
