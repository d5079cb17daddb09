// The decode matvec's input vector x built by every workgroup from a residual add the ops
// recorder left pending (pyapp.runtime.ops: a post-norm's add fused into the matvec that consumes
// its result, one dispatch fewer):
//   r = (PR + rms_norm(PY) * PW) [* PSC[0]]     the residual stream after the add;
//   x = r (PRO 1) or rms_norm(r) * PNW (PRO 2: the next block's pre-norm).
// Workgroup 0 also writes r to RO, the residual stream's other buffer (the others still read PR).
// Mirrors shaders/norm.wgsl add_normed. x lives in workgroup memory (XS = K / 4 vec4s); the
// including matvec declares K and WG and reads x through xv() after input_prologue().

override PRO: u32 = 1u;
override XS: u32 = 1u;
override PEPS: f32 = 1e-6;
override HAS_PSC: bool = false;

@group(0) @binding(4) var<storage, read> PY: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> PR: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> RO: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read> PW: array<vec4<f32>>;
@group(0) @binding(8) var<storage, read> PNW: array<vec4<f32>>;
@group(0) @binding(9) var<storage, read> PSC: array<f32>;

var<workgroup> xs: array<vec4<f32>, XS>;

//!include workgroup_sum

fn xv(i: u32) -> vec4<f32> { return xs[i]; }

// Each thread takes vec4s lid, lid + WG, ... (at most ROUNDS_MAX of them: K <= 4 WG ROUNDS_MAX) in
// all three passes, each pass's loads issued before its arithmetic (they are in flight together:
// the prologue is bound by memory latency); only the end needs a barrier.
const ROUNDS_MAX: u32 = RESIDUAL_INPUT_ROUNDS;      // from the prelude (pyapp.gpu.kernels)

fn input_prologue(lid: u32, first: bool) {
    let rounds = (K / 4u + WG - 1u) / WG;
    var ys: array<vec4<f32>, ROUNDS_MAX>;
    var ws: array<vec4<f32>, ROUNDS_MAX>;
    var rs: array<vec4<f32>, ROUNDS_MAX>;
    for (var j = 0u; j < ROUNDS_MAX; j++) {
        let i = lid + j * WG;
        if (j < rounds && i < K / 4u) {
            ys[j] = PY[i];
            rs[j] = PR[i];
            ws[j] = PW[i];
        } else {
            ys[j] = vec4<f32>(0.0);
        }
    }
    var ss = 0.0;
    for (var j = 0u; j < ROUNDS_MAX; j++) { ss += dot(ys[j], ys[j]); }
    let inv = inverseSqrt(workgroup_sum(lid, ss) / f32(K) + PEPS);
    var sc = 1.0;
    if (HAS_PSC) { sc = PSC[0]; }
    var ss2 = 0.0;
    for (var j = 0u; j < ROUNDS_MAX; j++) {
        let i = lid + j * WG;
        if (j < rounds && i < K / 4u) {
            let r = (rs[j] + ys[j] * inv * ws[j]) * sc;
            if (first) { RO[i] = r; }
            rs[j] = r;
            ss2 += dot(r, r);
        }
    }
    if (PRO == 2u) {
        for (var j = 0u; j < ROUNDS_MAX; j++) {
            let i = lid + j * WG;
            if (j < rounds && i < K / 4u) { ws[j] = PNW[i]; }
        }
        let inv2 = inverseSqrt(workgroup_sum(lid, ss2) / f32(K) + PEPS);
        for (var j = 0u; j < ROUNDS_MAX; j++) { rs[j] *= inv2 * ws[j]; }
    }
    for (var j = 0u; j < ROUNDS_MAX; j++) {
        let i = lid + j * WG;
        if (j < rounds && i < K / 4u) { xs[i] = rs[j]; }
    }
    workgroupBarrier();
}
