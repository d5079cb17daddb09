// Gemma 4's audio encoder: the ops the text model's kernels do not cover.
//
// Mirrors pyapp/families/gemma4_audio/reference.py (AudioEncoder). A clip is F.n log-mel frames of 128
// values; the subsampling halves the frames twice, and the conformer runs on S.n_tokens soft tokens
// (F: the frames uniform, a Step whose n_tokens counts a conv's input rows; S: the Step of the rest).
//   subsample: Y [ceil(F.n / 2), FO, CO] = relu(layer_norm(conv(X) over CO) * NW), the conv 3 x 3, stride
//              2, one zero row and column each side, X [F.n, FI, CI] (channels fastest), Wt [CO, CI, 3, 3]
//              (f32). Workgroup per output (t, f), a thread per output channel (WG >= CO); dispatch
//              ceil(F.n / 2) * FO workgroups, split into (x, y) above 65535.
//   attention: O [T, H, HD]: query t of head h over keys t - WINDOW + 1 .. t (none before 0), score
//              (Q[t] * QS * PDS) . (K[s] * KS + REL[t - s]) capped as CAP tanh(score / CAP), softmax,
//              the values' weighted sum. REL [WINDOW + 1, H, HD]: the relative positions' keys by
//              distance. Thread per (t, h); dispatch ceil(T * H / 64).
//   glu_depthwise: O [T, D] = the causal depthwise conv (Wt [D, KW], f32; tap KW - 1 the current
//              frame) of glu(X) = X[:, :D] * sigmoid(X[:, D:]) (X [T, 2D]), zero before frame 0.
//              Thread per float of O.
//   silu:      A = A * sigmoid(A) in place over T rows of D. Thread per float.
//   add_bias:  A[t] += B over T rows of D. Thread per float.

override D: u32 = 4u;
override CI: u32 = 1u;
override CO: u32 = 1u;
override FI: u32 = 128u;
override H: u32 = 1u;
override HD: u32 = 4u;
override WINDOW: u32 = 12u;
override QS: f32 = 1.0;
override KS: f32 = 1.0;
override CAP: f32 = 50.0;
override KW: u32 = 5u;
override EPS: f32 = 1e-6;
override WG: u32 = 64u;

@group(0) @binding(0) var<uniform> S: Step;
@group(0) @binding(1) var<uniform> F: Step;
@group(0) @binding(2) var<storage, read> X: array<f32>;
@group(0) @binding(3) var<storage, read_write> Y: array<f32>;
@group(0) @binding(4) var<storage, read> Wt: array<f32>;
@group(0) @binding(5) var<storage, read> NW: array<f32>;
@group(0) @binding(6) var<storage, read> Q: array<f32>;
@group(0) @binding(7) var<storage, read> K: array<f32>;
@group(0) @binding(8) var<storage, read> V: array<f32>;
@group(0) @binding(9) var<storage, read> REL: array<f32>;
@group(0) @binding(10) var<storage, read> PDS: array<f32>;
@group(0) @binding(11) var<storage, read_write> O: array<f32>;
@group(0) @binding(12) var<storage, read_write> A: array<f32>;
@group(0) @binding(13) var<storage, read> B: array<f32>;

//!include workgroup_sum
//!include thread_index
//!include gelu

@compute @workgroup_size(WG)
fn subsample(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let fo = (FI + 1u) / 2u;
    let rows = (F.n_tokens + 1u) / 2u;
    let cell = wid.x + wid.y * nwg.x;
    if (cell >= rows * fo) { return; }       // the whole workgroup: uniform
    let t = cell / fo;
    let f = cell % fo;
    var sum = 0.0;
    if (lid < CO) {
        for (var dt = 0u; dt < 3u; dt++) {
            let ti = i32(2u * t + dt) - 1;
            if (ti < 0 || ti >= i32(F.n_tokens)) { continue; }
            for (var df = 0u; df < 3u; df++) {
                let fi = i32(2u * f + df) - 1;
                if (fi < 0 || fi >= i32(FI)) { continue; }
                let x0 = (u32(ti) * FI + u32(fi)) * CI;
                let w0 = lid * CI * 9u + dt * 3u + df;
                for (var c = 0u; c < CI; c++) {
                    sum += Wt[w0 + c * 9u] * X[x0 + c];
                }
            }
        }
    }
    let mean = workgroup_sum(lid, sum) / f32(CO);
    let centered = select(0.0, sum - mean, lid < CO);
    let variance = workgroup_sum(lid, centered * centered) / f32(CO);
    if (lid < CO) {
        let normed = centered * inverseSqrt(variance + EPS) * NW[lid];
        Y[cell * CO + lid] = max(normed, 0.0);
    }
}

@compute @workgroup_size(64)
fn attention(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= S.n_tokens * H) { return; }
    let t = i / H;
    let h = i % H;
    let q0 = i * HD;
    var scores: array<f32, 32>;             // WINDOW <= 32
    var top = -3.0e38;
    let seen = min(WINDOW, t + 1u);
    for (var d = 0u; d < seen; d++) {
        let k0 = ((t - d) * H + h) * HD;
        let r0 = (d * H + h) * HD;
        var dot = 0.0;
        for (var e = 0u; e < HD; e++) {
            dot += Q[q0 + e] * QS * PDS[e] * (K[k0 + e] * KS + REL[r0 + e]);
        }
        let capped = CAP * tanh_safe(dot / CAP);
        scores[d] = capped;
        top = max(top, capped);
    }
    var total = 0.0;
    for (var d = 0u; d < seen; d++) {
        scores[d] = exp(scores[d] - top);
        total += scores[d];
    }
    for (var e = 0u; e < HD; e++) {
        var acc = 0.0;
        for (var d = 0u; d < seen; d++) {
            acc += scores[d] * V[((t - d) * H + h) * HD + e];
        }
        O[q0 + e] = acc / total;
    }
}

fn glu(t: u32, c: u32) -> f32 {
    let a = X[t * 2u * D + c];
    let b = X[t * 2u * D + D + c];
    return a / (1.0 + exp(-b));
}

@compute @workgroup_size(64)
fn glu_depthwise(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= S.n_tokens * D) { return; }
    let t = i / D;
    let c = i % D;
    var sum = 0.0;
    for (var k = 0u; k < KW; k++) {
        let back = KW - 1u - k;             // tap k reads the frame KW - 1 - k before t
        if (back > t) { continue; }
        sum += Wt[c * KW + k] * glu(t - back, c);
    }
    O[i] = sum;
}

@compute @workgroup_size(64)
fn silu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= S.n_tokens * D) { return; }
    let a = A[i];
    A[i] = a / (1.0 + exp(-a));
}

@compute @workgroup_size(64)
fn add_bias(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= S.n_tokens * D) { return; }
    A[i] += B[i % D];
}
