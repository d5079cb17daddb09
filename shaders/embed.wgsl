// Embedding row gather with dequantization: O[t, :] = W[IDS[t], :] * SCALE.
//
// Mirrors ggml_get_rows (+ the sqrt(hidden) scaling of Gemma's embeddings).
// W: raw GGUF bytes of rows [R0, R0 + RN) of a [V, D] table (a table larger than
// one binding is bound in row chunks, one dispatch each; ids outside the chunk
// are skipped). IDS: u32 [T]; O: f32 [T, D]; S.n_tokens = T (S: the per-step uniform).
// Thread per 4 floats.
// Dispatch: ceil(T * D / 4 / 64) workgroups (split above 65535).
//   soft_tokens: O[t] = ROWS[t] where AT[t] != 0: an encoder's soft tokens (an image's) in place of
//                those positions' embeddings; ROWS: f32 [T, D], AT: u32 [T], both written per step.

override D: u32;
override R0: u32 = 0u;
override RN: u32 = 4294967295u;
override SCALE: f32 = 1.0;

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> IDS: array<u32>;
@group(0) @binding(2) var<storage, read_write> O: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> S: Step;
@group(0) @binding(4) var<storage, read> ROWS: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> AT: array<u32>;

//!include quants

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = gid.x + gid.y * nwg.x * 64u;
    let gpr = D / 4u;
    if (id >= S.n_tokens * gpr) { return; }
    let t = id / gpr;
    let g = id % gpr;
    let row = IDS[t];
    if (row < R0 || row - R0 >= RN) { return; }
    let gpb = QK / 4u;
    O[id] = dq4((row - R0) * (D / QK) * QB + (g / gpb) * QB, g % gpb) * SCALE;
}

@compute @workgroup_size(64)
fn soft_tokens(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = gid.x + gid.y * nwg.x * 64u;
    if (id >= S.n_tokens * (D / 4u)) { return; }
    if (AT[id / (D / 4u)] != 0u) { O[id] = ROWS[id]; }
}
