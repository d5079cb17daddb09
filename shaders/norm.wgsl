// RMSNorm: y = x / sqrt(mean(x^2) + eps) [* w]   (Gemma 4 stores w as is, no +1)
//
// Mirrors reference.forward.rms_norm / ggml_rms_norm (+ ggml_mul by the weight).
// X: f32 [T * RPT, D] (RPT rows per token: 1 for hidden states, heads for the
// per-head q/k/v norms). Wt: f32 [D] (unused when HAS_W is false). S.n_tokens = T
// (S: Step, the per-step uniform). One workgroup per row, tree reduction.
// Dispatch: T * RPT workgroups, split into (x, y) above 65535. Entry points:
//   main:       Y = norm(X) [* Wt] * SCALE   (SCALE: a constant factor, e.g. the MoE
//               router's 1/sqrt(hidden), kept out of the weights)
//   norm_pair:  Y = norm(X) [* Wt] * SCALE and A = norm(X) * W2: two norms of one row in one
//               pass (the MoE router's input and the experts' input)
//   add_normed: A = (A + norm(X) * Wt) [* SC[0]]   residual add of a post-norm,
//               optionally times layer_output_scale (saves two dispatches); X may be a prefill
//               matmul's XSPLIT slices of K left unsummed (f32 [XSPLIT, T, D]), added as read (saves
//               sum_slices.wgsl's dispatch; also in add_normed_q8 and add_q8);
//               HAS_NEXT: also Y = norm(A) * W2, the next pre-norm (saves one more)
//   add_normed_q8: add_normed with HAS_NEXT whose Y rows are also rounded to int8 for the int8
//               matmuls that read them (XQ, XS as quantize_q8.wgsl writes them: its dispatch
//               saved), Y written only where KEEP (a reader takes the f32 rows: a LoRA delta)
//   add_q8:     add_normed without a next pre-norm whose sum A is rounded so (the stream read
//               next by an int8 matmul: Gemma 4's per-layer-input gate)
//   norm_rope:  Y = rope(norm(X) * Wt) per head row: the q/k norm then NeoX RoPE
//               (as rope.wgsl: pairs (i, i + NROT/2), theta = pos * BASE^(-2i/NROT)
//               / FF[i]); token t = row / RPT sits at position S.pos0 + t.
//   layer_norm: Y = (X - mean) / sqrt(var + EPS) * Wt + LB: PyTorch's LayerNorm (not RMS: the
//               12B's image patch projection), the variance of the centered row (two passes,
//               as torch). Mirrors gemma4_vision/reference.py layer_norm.

override D: u32;
override RPT: u32 = 1u;
override EPS: f32 = 1e-6;
override HAS_W: bool = true;
override HAS_SC: bool = false;
override HAS_NEXT: bool = false;
override NROT: u32 = 0u;
override BASE: f32 = 10000.0;
override HAS_FF: bool = false;
override SCALE: f32 = 1.0;
override KEEP: bool = true;
override WG: u32 = 256u;
override XSPLIT: u32 = 1u;

@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read_write> Y: array<f32>;
@group(0) @binding(2) var<storage, read> Wt: array<f32>;
@group(0) @binding(3) var<uniform> S: Step;
@group(0) @binding(4) var<storage, read_write> A: array<f32>;
@group(0) @binding(5) var<storage, read> SC: array<f32>;
@group(0) @binding(6) var<storage, read> FF: array<f32>;
@group(0) @binding(8) var<storage, read> W2: array<f32>;
@group(0) @binding(9) var<storage, read> LB: array<f32>;
@group(0) @binding(10) var<storage, read_write> XQ: array<u32>;
@group(0) @binding(11) var<storage, read_write> XS: array<vec2<f32>>;

//!include workgroup_sum
//!include sincos
//!include q8_block
//!include q8_gather

// X[j], or the sum of its XSPLIT slices (T * D floats apart).
fn x_at(j: u32) -> f32 {
    var v = X[j];
    for (var z = 1u; z < XSPLIT; z++) { v += X[z * S.n_tokens * D + j]; }
    return v;
}

// 1 / rms of row `base`, shared by every thread of the workgroup.
fn inv_rms(base: u32, lid: u32) -> f32 {
    var ss = 0.0;
    for (var i = lid; i < D; i += WG) {
        let v = x_at(base + i);
        ss += v * v;
    }
    return inverseSqrt(workgroup_sum(lid, ss) / f32(D) + EPS);
}

fn weight(i: u32) -> f32 {
    return select(1.0, Wt[i], HAS_W);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= S.n_tokens * RPT) { return; }   // uniform per workgroup: barriers stay legal
    let base = row * D;
    let inv = inv_rms(base, lid) * SCALE;
    for (var i = lid; i < D; i += WG) { Y[base + i] = X[base + i] * inv * weight(i); }
}

@compute @workgroup_size(WG)
fn norm_pair(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= S.n_tokens * RPT) { return; }
    let base = row * D;
    let inv = inv_rms(base, lid);
    for (var i = lid; i < D; i += WG) {
        let v = X[base + i] * inv;
        Y[base + i] = v * weight(i) * SCALE;
        A[base + i] = v * W2[i];
    }
}

// add_normed's residual add for row `base` (A += norm(X) * Wt, times SC[0] where HAS_SC): the sum of
// squares of this thread's updated elements (i = lid, lid + WG, ...).
fn add_post_norm(base: u32, lid: u32) -> f32 {
    let inv = inv_rms(base, lid);
    var sc = 1.0;
    if (HAS_SC) { sc = SC[0]; }
    var ss = 0.0;
    for (var i = lid; i < D; i += WG) {
        let a = (A[base + i] + x_at(base + i) * inv * weight(i)) * sc;
        A[base + i] = a;
        ss += a * a;
    }
    return ss;
}

@compute @workgroup_size(WG)
fn add_normed(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= S.n_tokens * RPT) { return; }
    let base = row * D;
    let ss = add_post_norm(base, lid);
    if (HAS_NEXT) {                     // uniform: barriers stay legal
        let inv2 = inverseSqrt(workgroup_sum(lid, ss) / f32(D) + EPS);
        for (var i = lid; i < D; i += WG) { Y[base + i] = A[base + i] * inv2 * W2[i]; }
    }
}

@compute @workgroup_size(WG)
fn add_normed_q8(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= S.n_tokens * RPT) { return; }
    let base = row * D;
    let inv2 = inverseSqrt(workgroup_sum(lid, add_post_norm(base, lid)) / f32(D) + EPS);
    rounded_rows(row, base, inv2, true, lid);
}

@compute @workgroup_size(WG)
fn add_q8(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= S.n_tokens * RPT) { return; }
    let base = row * D;
    add_post_norm(base, lid);
    rounded_rows(row, base, 1.0, false, lid);
}

// Row `row` of A rounded to int8 per block of 32 (q8_block.wgsl's rule, quantize_q8.wgsl's layout: XQ [row,
// D / 4] words, XS [row, D / 32] (d, sum)), or where `normed` the next pre-norm norm(A) * W2 (1 / rms = inv),
// also written to Y where KEEP: four values a thread, 8 threads a block, as quantize_q8.wgsl. Uniform
// control flow.
fn rounded_rows(row: u32, base: u32, inv: f32, normed: bool, lid: u32) {
    storageBarrier();                        // A's values came from other threads of this workgroup
    for (var w0 = 0u; w0 < D / 4u; w0 += WG) {
        let w = w0 + lid;
        let here = w < D / 4u;
        var v = vec4<f32>(0.0);
        if (here) {
            let i = base + 4u * w;
            v = vec4<f32>(A[i], A[i + 1u], A[i + 2u], A[i + 3u]);
            if (normed) {
                v = v * inv * vec4<f32>(W2[4u * w], W2[4u * w + 1u], W2[4u * w + 2u], W2[4u * w + 3u]);
                if (KEEP) { Y[i] = v.x; Y[i + 1u] = v.y; Y[i + 2u] = v.z; Y[i + 3u] = v.w; }
            }
        }
        let m = q8_gather(lid, v);
        if (here) {
            let s = q8_scale(m.x);
            XQ[row * (D / 4u) + w] = q8_word(v, s.y);
            if (lid % 8u == 0u) { XS[row * (D / 32u) + w / 8u] = vec2<f32>(s.x, m.y); }
        }
        workgroupBarrier();                  // every thread has its block's figures before q8_parts is reused
    }
}

// Output dim i of rope(norm(X[base..base+D]) * Wt) for a token at position pos.
fn roped(base: u32, i: u32, inv: f32, pos: f32) -> f32 {
    let half = NROT / 2u;
    if (i >= NROT) { return X[base + i] * inv * weight(i); }
    let j = i % half;                        // the pair (j, j + half)
    var inv_freq = pow(BASE, -2.0 * f32(j) / f32(NROT));
    if (HAS_FF) { inv_freq /= FF[j]; }
    let a = pos * inv_freq;
    let x0 = X[base + j] * inv * weight(j);
    let x1 = X[base + j + half] * inv * weight(j + half);
    let sc = sin_cos(a);
    return select(x1 * sc.y + x0 * sc.x, x0 * sc.y - x1 * sc.x, i < half);
}

@compute @workgroup_size(WG)
fn norm_rope(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= S.n_tokens * RPT) { return; }
    let base = row * D;
    let inv = inv_rms(base, lid);
    let pos = f32(S.pos0 + row / RPT);
    for (var i = lid; i < D; i += WG) { Y[base + i] = roped(base, i, inv, pos); }
}

// The mean of row `base` and 1 / the root of its centered values' mean square + EPS, shared by every
// thread of the workgroup.
fn mean_inv_std(base: u32, lid: u32) -> vec2<f32> {
    var sum = 0.0;
    for (var i = lid; i < D; i += WG) { sum += X[base + i]; }
    let mean = workgroup_sum(lid, sum) / f32(D);
    var ss = 0.0;
    for (var i = lid; i < D; i += WG) { ss += (X[base + i] - mean) * (X[base + i] - mean); }
    return vec2<f32>(mean, inverseSqrt(workgroup_sum(lid, ss) / f32(D) + EPS));
}

@compute @workgroup_size(WG)
fn layer_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= S.n_tokens) { return; }
    let base = row * D;
    let stats = mean_inv_std(base, lid);
    for (var i = lid; i < D; i += WG) { Y[base + i] = (X[base + i] - stats.x) * stats.y * Wt[i] + LB[i]; }
}
