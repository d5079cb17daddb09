// A prefill matmul's slices of K added (matmul_q8.wgsl or matmul.wgsl with SPLIT > 1): Y[t, r] = sum_z
// P[z, t, r] for the step's T = S.n_tokens tokens, P f32 [SPLIT, T, N], Y f32 [T, LDY] (LDY 0: N). One
// thread four output floats (N a multiple of 4: pyapp.gpu.kernels checks).
// Dispatch: ceil(T_max * N / 4 / 64) workgroups (over (x, y) above 65535: thread_index.wgsl).

override N: u32;
override SPLIT: u32;
override LDY: u32 = 0u;

@group(0) @binding(0) var<storage, read> P: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> Y: array<f32>;
@group(0) @binding(2) var<uniform> S: Step;

//!include thread_index

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    let tn = S.n_tokens * N / 4u;
    if (i >= tn) { return; }
    var y = P[i];
    for (var z = 1u; z < SPLIT; z++) {
        y += P[z * tn + i];
    }
    let o = 4u * i / N * select(LDY, N, LDY == 0u) + 4u * i % N;
    Y[o] = y.x;
    Y[o + 1u] = y.y;
    Y[o + 2u] = y.z;
    Y[o + 3u] = y.w;
}
