// LoRA delta of one adapted projection, added after the base matvec / matmul wrote Y:
//
//   Y[t * LDY + COL0 + i] += SC[0] * sum_j B[i, j] * (sum_k A[j, k] * X[t * K + k])   (i < N, t < S.n_tokens)
//
// Mirrors llama.cpp's build_lora_mm (res += scale * B (A x)) and pyapp.reference.forward.apply_lora.
// A: f32 [R, K] (the adapter's lora_a, row-major as stored: ggml ne [K, R]); B: f32 [N, R] (lora_b,
// ne [R, N]); X: f32 [T, K]; Y: f32 rows of LDY floats, this projection's outputs from column COL0
// (a fused q|k|v or gate|up output holds several projections). SC: this target's scale
// (user_scale * alpha / R), bound at its own slot of a buffer the engine rewrites when the user
// scale changes, so plans stay as recorded.
// Grouped (SEGS > 1): the deltas of up to 3 projections that share x and sit side by side in Y (a
// fused q|k|v or gate|up output) in one dispatch: A holds their A's one after the other [SEGS * R, K],
// B their B's [N, R] (N = the sum of their outputs), and output i belongs to projection
// (i >= BND1) + (i >= BND2), whose R values of A x it takes. They share one scale (same adapter, same rank).
// Workgroup (x, t): the RT = SEGS * R dot products A x_t (one shared-memory tree for all of them), then OPW of
// the outputs. Rank-R work
// is tiny next to the base projection, so every workgroup recomputes A x_t rather than taking a
// second dispatch. Dispatch: (ceil(N / OPW), T); workgroups of tokens t >= S.n_tokens return.

override K: u32;
override N: u32;
override R: u32;
override LDY: u32;
override COL0: u32 = 0u;
override WG: u32 = 64u;
override OPW: u32 = 256u;      // outputs per workgroup
override RT: u32;              // SEGS * R: rows of A
override BND1: u32;            // the first output of the second projection (N when SEGS == 1)
override BND2: u32;            // the first output of the third (N when SEGS < 3)

@group(0) @binding(0) var<storage, read> A: array<f32>;
@group(0) @binding(1) var<storage, read> B: array<f32>;
@group(0) @binding(2) var<storage, read> X: array<f32>;
@group(0) @binding(3) var<storage, read_write> Y: array<f32>;
@group(0) @binding(4) var<storage, read> SC: array<f32>;
@group(0) @binding(5) var<uniform> S: Step;

var<workgroup> part: array<f32, RT * WG>;   // [RT, WG]: each thread's share of every dot, then their sums

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.y;
    if (t >= S.n_tokens) { return; }
    let x0 = t * K;
    for (var j = 0u; j < RT; j++) { part[j * WG + lid] = 0.0; }
    for (var k = lid; k < K; k += WG) {
        let xv = X[x0 + k];
        for (var j = 0u; j < RT; j++) { part[j * WG + lid] += A[j * K + k] * xv; }
    }
    workgroupBarrier();
    for (var h = WG / 2u; h > 0u; h >>= 1u) {      // all RT trees at once: log2(WG) barriers, not RT times that
        if (lid < h) {
            for (var j = 0u; j < RT; j++) { part[j * WG + lid] += part[j * WG + lid + h]; }
        }
        workgroupBarrier();
    }
    let scale = SC[0];
    let end = min(N, (wid.x + 1u) * OPW);
    for (var i = wid.x * OPW + lid; i < end; i += WG) {
        let seg = select(0u, 1u, i >= BND1) + select(0u, 1u, i >= BND2);
        var d = 0.0;
        for (var j = 0u; j < R; j++) {
            d += B[i * R + j] * part[(seg * R + j) * WG];
        }
        Y[t * LDY + COL0 + i] += scale * d;
    }
}
