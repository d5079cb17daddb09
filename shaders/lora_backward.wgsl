// LoRA backward of one adapted projection y = W x + s B (A x) (the forward: lora.wgsl), given dY:
//
//   u = x A^T [T, R];  du = s dY B [T, R];  dB += s dY^T u [N, R];  dA += du^T x [R, K];  dX += du A [T, K]
//
// Mirrors pyapp.reference.backward.lora_backward (the rank-R intermediate u recomputed, not stored).
// A: f32 [R, K] (lora_a), B: f32 [N, R] (lora_b), X: f32 [T, K] (the projection's input, kept by the
// forward), DY: f32 rows of LDD floats, this projection's outputs from column COL0 (fused q|k|v, gate|up).
// DX: f32 [T, K], added into (after matmul_dx wrote the frozen W's part). DA, DB: the gradients, added
// into (accumulation over micro-batches; the trainer zeroes them). SC: the target's scale s (its slot,
// as lora.wgsl). UD: scratch [T, 2R]: s u, then du, per token. T = S.n_tokens; R <= 16.
// Entry points (in this order, one plan):
//   rank:  workgroup per token: s u and du (tree reductions over K and N), written to UD; then
//          dX[t] += du A. Dispatch: T workgroups (split above 65535).
//   grads: thread per column: k < K: dA[:, k] += sum_t du[t, :] X[t, k]; K <= c < K + N: n = c - K:
//          dB[n, :] += sum_t dY[t, n] s u[t, :] (R accumulators a thread, UD rows read uniformly).
//          Dispatch: ceil((K + N) / WG) workgroups (split above 65535).

override K: u32;
override N: u32;
override R: u32;
override LDD: u32 = 0u;    // dY row stride (0: N)
override COL0: u32 = 0u;
override WG: u32 = 64u;

@group(0) @binding(0) var<storage, read> A: array<f32>;
@group(0) @binding(1) var<storage, read> B: array<f32>;
@group(0) @binding(2) var<storage, read> X: array<f32>;
@group(0) @binding(3) var<storage, read> DY: array<f32>;
@group(0) @binding(4) var<storage, read_write> DX: array<f32>;
@group(0) @binding(5) var<storage, read_write> DA: array<f32>;
@group(0) @binding(6) var<storage, read_write> DB: array<f32>;
@group(0) @binding(7) var<storage, read_write> UD: array<f32>;
@group(0) @binding(8) var<storage, read> SC: array<f32>;
@group(0) @binding(9) var<uniform> S: Step;

const RMAX: u32 = 16u;
var<workgroup> part: array<f32, 2 * R * WG>;   // [2R, WG]: each thread's share of u's and du's dots, then sums

fn ldd() -> u32 {
    return select(LDD, N, LDD == 0u);
}

@compute @workgroup_size(WG)
fn rank(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let t = wid.x + wid.y * nwg.x;
    if (t >= S.n_tokens) { return; }       // uniform per workgroup: barriers stay legal
    let s = SC[0];
    let x0 = t * K;
    let y0 = t * ldd() + COL0;
    for (var j = 0u; j < 2u * R; j++) { part[j * WG + lid] = 0.0; }
    for (var k = lid; k < K; k += WG) {
        let xv = X[x0 + k];
        for (var j = 0u; j < R; j++) { part[j * WG + lid] += A[j * K + k] * xv; }
    }
    for (var n = lid; n < N; n += WG) {
        let dy = DY[y0 + n];
        for (var j = 0u; j < R; j++) { part[(R + j) * WG + lid] += dy * B[n * R + j]; }
    }
    workgroupBarrier();
    for (var h = WG / 2u; h > 0u; h >>= 1u) {      // all 2R trees at once
        if (lid < h) {
            for (var j = 0u; j < 2u * R; j++) { part[j * WG + lid] += part[j * WG + lid + h]; }
        }
        workgroupBarrier();
    }
    if (lid < 2u * R) { UD[t * 2u * R + lid] = s * part[lid * WG]; }     // s u, then du
    for (var k = lid; k < K; k += WG) {
        var d = 0.0;
        for (var j = 0u; j < R; j++) { d += part[(R + j) * WG] * A[j * K + k]; }
        DX[x0 + k] += s * d;
    }
}

@compute @workgroup_size(WG)
fn grads(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let c = gid.x + gid.y * nwg.x * WG;
    if (c >= K + N) { return; }
    let T = S.n_tokens;
    var acc: array<f32, RMAX>;
    if (c < K) {
        for (var t = 0u; t < T; t++) {
            let xv = X[t * K + c];
            for (var j = 0u; j < R; j++) { acc[j] += UD[t * 2u * R + R + j] * xv; }
        }
        for (var j = 0u; j < R; j++) { DA[j * K + c] += acc[j]; }
    } else {
        let n = c - K;
        let ld = ldd();
        for (var t = 0u; t < T; t++) {
            let yv = DY[t * ld + COL0 + n];
            for (var j = 0u; j < R; j++) { acc[j] += UD[t * 2u * R + j] * yv; }
        }
        for (var j = 0u; j < R; j++) { DB[n * R + j] += acc[j]; }
    }
}
