// Mixture of experts: expert matvecs gathered by expert id, combine (the router: moe_route.wgsl).
//
// Mirrors reference.forward ReferenceModel.moe (Ollama's gemma4 TextMoE):
//   experts: Y[s, n] = sum_k W[IDS[s], n, k] * X[xrow(s), k] for slots s = t*KSEL + j,
//            W raw GGUF bytes of [E, N, K]; xrow = t (XPER = 1, shared input) or s
//            (XPER = KSEL, one input row per slot). Like matvec.wgsl, TPR threads per
//            row. GEGLU: W is [E, 2N, K], each expert's gate rows then its up rows, and
//            Y[s, n] = gelu(gate_n . x) * (up_n . x) (decode: one dispatch, not two).
//            Dispatch (ceil(N / (WG/TPR)), T * KSEL).
//   combine: C[t, d] = sum_j WTS[t, j] * YE[t*KSEL + j, d] * SC[IDS[t*KSEL + j]]
//            (SC: per-expert down scale, 1 when HAS_SC is false). Dispatch ceil(T*D / 64).
// S.n_tokens = T tokens (S: Step, the per-step uniform).

override KSEL: u32 = 1u;
override K: u32 = 4u;
override N: u32 = 1u;
override XPER: u32 = 1u;
override D: u32 = 1u;
override HAS_SC: bool = false;
override GEGLU: bool = false;  // experts: W rows gate then up per expert, Y = gelu(gate) * up
override E0: u32 = 0u;       // experts: the first expert in W
override NE: u32 = 1u;       // experts: how many W holds
override TPR: u32 = 64u;
override WG: u32 = 256u;

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> S: Step;
@group(0) @binding(4) var<storage, read_write> IDS: array<u32>;
@group(0) @binding(5) var<storage, read_write> WTS: array<f32>;
@group(0) @binding(8) var<storage, read> YE: array<f32>;
@group(0) @binding(9) var<storage, read> SC: array<f32>;

//!include quants
//!include gelu

var<workgroup> red: array<f32, WG>;
var<workgroup> red2: array<f32, WG>;

// 4-weight group g of the row at rowbase (and, GEGLU, of the up row at upbase) . X row xrow.
fn group_dot(rowbase: u32, upbase: u32, xrow: u32, g: u32) -> vec2<f32> {
    let gpb = QK / 4u;
    let xv = X[xrow * (K / 4u) + g];
    var v = vec2<f32>(dot(dq4(rowbase + (g / gpb) * QB, g % gpb), xv), 0.0);
    if (GEGLU) { v.y = dot(dq4(upbase + (g / gpb) * QB, g % gpb), xv); }
    return v;
}

@compute @workgroup_size(WG)
fn experts(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let slot = wid.y;
    if (slot >= S.n_tokens * KSEL) { return; }
    let row = wid.x * (WG / TPR) + lid / TPR;
    let t = lid % TPR;
    let e = IDS[slot];
    // W holds experts E0 .. E0 + NE - 1 (a big expert tensor is split over buffers): others skip
    // the work but still meet the barriers below
    let here = e >= E0 && e < E0 + NE;
    let xrow = select(slot / KSEL, slot, XPER > 1u);
    let rows_per_expert = select(N, 2u * N, GEGLU);
    let rowbase = (select(0u, e - E0, here) * rows_per_expert + min(row, N - 1u)) * (K / QK) * QB;
    let upbase = rowbase + N * (K / QK) * QB;        // GEGLU: the matching up row
    // four groups a round: their loads in flight together (the kernel is bound by memory latency)
    var acc = vec2<f32>(0.0);
    if (here) {
        var g = t;
        for (; g + 3u * TPR < K / 4u; g += 4u * TPR) {
            acc += group_dot(rowbase, upbase, xrow, g) + group_dot(rowbase, upbase, xrow, g + TPR)
                 + group_dot(rowbase, upbase, xrow, g + 2u * TPR) + group_dot(rowbase, upbase, xrow, g + 3u * TPR);
        }
        for (; g < K / 4u; g += TPR) { acc += group_dot(rowbase, upbase, xrow, g); }
    }
    red[lid] = acc.x;
    red2[lid] = acc.y;
    workgroupBarrier();
    for (var s = TPR / 2u; s > 0u; s >>= 1u) {
        if (t < s) {
            red[lid] += red[lid + s];
            red2[lid] += red2[lid + s];
        }
        workgroupBarrier();
    }
    if (t == 0u && row < N && here) { Y[slot * N + row] = select(red[lid], gelu_tanh(red[lid]) * red2[lid], GEGLU); }
}

@compute @workgroup_size(64)
fn combine(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if (i >= S.n_tokens * D) { return; }
    let t = i / D;
    let d = i % D;
    var acc = 0.0;
    for (var j = 0u; j < KSEL; j++) {
        let s = t * KSEL + j;
        var w = WTS[s];
        if (HAS_SC) { w *= SC[IDS[s]]; }
        acc += w * YE[s * D + d];
    }
    Y[i] = acc;
}
