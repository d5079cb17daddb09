// NeoX RoPE, in place: pairs (i, i + NROT/2) for i < NROT/2 of every head;
// dims >= NROT (partial rotary) are left alone.
//
// Mirrors reference.forward.rope_neox / ggml_rope_ext mode NEOX:
// theta = pos * BASE^(-2i/NROT) / FF[i] (FF = rope_freqs, Gemma 4 global layers).
// X: f32 [T, H, HD]; token t has position S.pos0 + t; S.n_tokens = T (S: the per-step
// uniform). FF: f32 [>= NROT/2]
// (bound but unused when HAS_FF is false). Thread per (t, h, i).
// Dispatch: ceil(T * H * NROT / 2 / 64) workgroups (split above 65535).

override H: u32;
override HD: u32;
override NROT: u32;
override BASE: f32 = 10000.0;
override HAS_FF: bool = false;

@group(0) @binding(0) var<storage, read_write> X: array<f32>;
@group(0) @binding(1) var<storage, read> FF: array<f32>;
@group(0) @binding(2) var<uniform> S: Step;

//!include sincos

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let half = NROT / 2u;
    let id = gid.x + gid.y * nwg.x * 64u;
    if (id >= S.n_tokens * H * half) { return; }
    let i = id % half;
    let th = id / half;                      // t * H + h
    let pos = f32(S.pos0 + th / H);
    var inv_freq = pow(BASE, -2.0 * f32(i) / f32(NROT));
    if (HAS_FF) { inv_freq /= FF[i]; }
    let a = pos * inv_freq;
    let sc = sin_cos(a);
    let c = sc.y;
    let s = sc.x;
    let j = th * HD + i;
    let x0 = X[j];
    let x1 = X[j + half];
    X[j] = x0 * c - x1 * s;
    X[j + half] = x1 * c + x0 * s;
}
