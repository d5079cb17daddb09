// The decode matvec's input vector x built by every workgroup from a row it norms (a MoE layer's
// router, pyapp.runtime.ops.router: norm.wgsl norm_pair folded into the router matvec, one
// dispatch fewer):
//   x = rms_norm(NX) [* NW] * NSCALE;
// workgroup 0 also writes x to NXO and rms_norm(NX) * NW2 to NYO (norm_pair's two outputs: the
// router's input and the experts' input). x lives in workgroup memory (XS = K / 4 vec4s); the
// including matvec declares K and WG and reads x through xv() after input_prologue().

override XS: u32 = 1u;
override NEPS: f32 = 1e-6;
override HAS_NW: bool = false;
override NSCALE: f32 = 1.0;

@group(0) @binding(4) var<storage, read> NX: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> NXO: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read> NW: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read> NW2: array<vec4<f32>>;
@group(0) @binding(8) var<storage, read_write> NYO: array<vec4<f32>>;

var<workgroup> xs: array<vec4<f32>, XS>;

//!include workgroup_sum

fn xv(i: u32) -> vec4<f32> { return xs[i]; }

// Each thread takes vec4s lid, lid + WG, ... (at most ROUNDS_MAX: K <= 4 WG ROUNDS_MAX), its loads
// issued before its arithmetic (the prologue is bound by memory latency).
const ROUNDS_MAX: u32 = RESIDUAL_INPUT_ROUNDS;      // from the prelude (pyapp.gpu.kernels)

fn input_prologue(lid: u32, first: bool) {
    let rounds = (K / 4u + WG - 1u) / WG;
    var xr: array<vec4<f32>, ROUNDS_MAX>;
    var ws: array<vec4<f32>, ROUNDS_MAX>;
    for (var j = 0u; j < ROUNDS_MAX; j++) {
        let i = lid + j * WG;
        if (j < rounds && i < K / 4u) {
            xr[j] = NX[i];
            ws[j] = select(vec4<f32>(1.0), NW[i], HAS_NW);
        } else {
            xr[j] = vec4<f32>(0.0);
        }
    }
    var ss = 0.0;
    for (var j = 0u; j < ROUNDS_MAX; j++) { ss += dot(xr[j], xr[j]); }
    let inv = inverseSqrt(workgroup_sum(lid, ss) / f32(K) + NEPS);
    for (var j = 0u; j < ROUNDS_MAX; j++) {
        let i = lid + j * WG;
        if (j < rounds && i < K / 4u) {
            let x = xr[j] * inv * ws[j] * NSCALE;
            xs[i] = x;
            if (first) {
                NXO[i] = x;
                NYO[i] = xr[j] * inv * NW2[i];
            }
        }
    }
    workgroupBarrier();
}
