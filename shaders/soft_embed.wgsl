// Soft embeddings: DiffusionGemma's self-conditioning input, softmax(L) @ E * SCALE, without ever
// materializing the [T, V] probabilities or the [V, D] table as floats.
//
// Mirrors reference.diffusion.self_conditioning's `soft = softmax(L) @ token_embd * sqrt(hidden)`.
// L: f32 [T, V] logits (the previous step's processed logits), T = S.n_tokens (S: the per-step
// uniform). E: raw GGUF bytes of rows [R0, R0 + RN) of the [V, D] embedding table (a table larger
// than one binding is bound in row blocks, one `mix` dispatch each, the later ones accumulating).
//   row_stats: ST[t] = (max_v L[t, v], 1 / sum_v exp(L[t, v] - max)) in f32.
//              One workgroup of WG threads per row. Dispatch T (split above 65535).
//   mix:       O[t, d] (+)= sum_{v in the block} exp(L[t, v] - ST[t].x) * ST[t].y * E[v, d] * SCALE
//              (ACC: add to O; else overwrite). Tiles of 64 rows of O x 64 dims, 16 vocabulary rows
//              per step through shared memory; each of the 256 threads owns 4 rows x 4 dims.
//              Dispatch (ceil(D / 64), ceil(T / 64)).
// D: a multiple of QK (the quants prelude: QK, QB, dq4).

override V: u32;
override D: u32;
override R0: u32 = 0u;
override RN: u32 = 0u;
override SCALE: f32 = 1.0;
override ACC: bool = false;
override WG: u32 = 256u;

@group(0) @binding(0) var<storage, read> L: array<f32>;
@group(0) @binding(1) var<storage, read_write> ST: array<vec2<f32>>;
@group(0) @binding(2) var<uniform> S: Step;
@group(0) @binding(3) var<storage, read> W: array<u32>;
@group(0) @binding(4) var<storage, read> STR: array<vec2<f32>>;
@group(0) @binding(5) var<storage, read_write> O: array<vec4<f32>>;

//!include quants

//!include workgroup_reduce

@compute @workgroup_size(WG)
fn row_stats(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let t = wid.x + wid.y * nwg.x;
    if (t >= S.n_tokens) { return; }         // uniform per workgroup: no barrier is skipped unevenly
    let base = t * V;
    var m = -3.0e38;
    for (var v = lid; v < V; v += WG) { m = max(m, L[base + v]); }
    red[lid] = m;
    m = reduce(lid, true);
    var s = 0.0;
    for (var v = lid; v < V; v += WG) { s += exp(L[base + v] - m); }
    red[lid] = s;
    s = reduce(lid, false);
    if (lid == 0u) { ST[t] = vec2<f32>(m, 1.0 / s); }
}

const TILE: u32 = 64u;
const VS: u32 = 16u;                                 // vocabulary rows per step
var<workgroup> ps: array<f32, 1024>;                 // [TILE rows][VS] probabilities
var<workgroup> es: array<vec4<f32>, 256>;            // [VS rows][TILE / 4] table values

@compute @workgroup_size(256)
fn mix(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let T = S.n_tokens;
    let g0 = wid.x * (TILE / 4u);            // first vec4 group of D this tile covers
    let t0 = wid.y * TILE;
    let tx = lid % 16u;                      // this thread's vec4 of dims: group g0 + tx
    let ty = lid / 16u;                      // and rows t0 + ty + 16j
    let gpr = D / 4u;
    let gpb = QK / 4u;
    let rb = (D / QK) * QB;                  // bytes of one table row
    var acc = array<vec4<f32>, 4>(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
    for (var v0 = 0u; v0 < RN; v0 += VS) {
        // probabilities: 64 rows x 16 vocabulary entries, 4 a thread
        for (var i = 0u; i < 4u; i++) {
            let k = lid + 256u * i;
            let r = k / VS;
            let c = k % VS;
            let t = t0 + r;
            var pv = 0.0;
            if (t < T && v0 + c < RN) {
                let st = STR[t];
                pv = exp(L[t * V + R0 + v0 + c] - st.x) * st.y;
            }
            ps[k] = pv;
        }
        // table: 16 rows x 64 dims, one vec4 a thread
        let er = lid / 16u;
        let g = g0 + lid % 16u;
        var ev = vec4<f32>(0.0);
        if (v0 + er < RN && g < gpr) { ev = dq4((v0 + er) * rb + (g / gpb) * QB, g % gpb); }
        es[lid] = ev;
        workgroupBarrier();
        for (var c = 0u; c < VS; c++) {
            let e = es[c * 16u + tx];
            for (var j = 0u; j < 4u; j++) { acc[j] += ps[(ty + 16u * j) * VS + c] * e; }
        }
        workgroupBarrier();
    }
    let g = g0 + tx;
    if (g >= gpr) { return; }
    for (var j = 0u; j < 4u; j++) {
        let t = t0 + ty + 16u * j;
        if (t < T) {
            let o = t * gpr + g;
            if (ACC) { O[o] += acc[j] * SCALE; } else { O[o] = acc[j] * SCALE; }
        }
    }
}
