// Attention over a KV cache for a step of tokens (causal, optional sliding window, GQA); the decode
// step's split-K kernels are in attention_decode.wgsl.
//
// Mirrors reference.forward attention: softmax(SCALE * q k^T + mask) v, keys at
// positions j with j <= p and (WINDOW == 0 or p - j < WINDOW) for a query at p.
// Q, O: f32 [T, H, HD]; token t is at position p = S.pos0 + t, S.n_tokens = T
// (S: Step, the per-step uniform; it and DECODE_KEYS_PER_GROUP come from the prelude
// pyapp.gpu.kernels generates).
// KC, VC: f32 [HKV, CTX, HD]; position j lives in slot j % CTX (a ring of CTX
// >= WINDOW slots serves sliding layers). Query head h reads kv head h / (H / HKV).
//   store:  writes Kn, Vn [T, HKV, HD] into the caches. Dispatch ceil(T*HKV*HD/64).
//   attend: one workgroup per (GH query heads of one KV head, token), keys in chunks of WG
//           with an online softmax; each thread owns output dims lid, lid + WG, ... (HD <= 4 WG).
//           Dispatch (H / GH, T).

//!include attention_shape
override WINDOW: u32 = 0u;
override ALL_KEYS: bool = false;   // attend: every key of the step (bidirectional), not j <= pos
override BLOCKS: bool = false;     // attend: also the KL[t] keys after pos (the rest of an image's block)
override WG: u32 = 128u;

@group(0) @binding(0) var<storage, read> Q: array<f32>;
@group(0) @binding(1) var<storage, read_write> KC: array<f32>;
@group(0) @binding(2) var<storage, read_write> VC: array<f32>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;
@group(0) @binding(4) var<uniform> S: Step;
@group(0) @binding(5) var<storage, read> Kn: array<f32>;
@group(0) @binding(6) var<storage, read> Vn: array<f32>;
@group(0) @binding(7) var<storage, read> KL: array<u32>;   // attend with BLOCKS: keys after its own each token sees


@compute @workgroup_size(64)
fn store(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = gid.x + gid.y * nwg.x * 64u;
    if (id >= S.n_tokens * HKV * HD) { return; }
    let d = id % HD;
    let kh = (id / HD) % HKV;
    let t = id / (HD * HKV);
    let dst = (kh * CTX + (S.pos0 + t) % CTX) * HD + d;
    KC[dst] = Kn[id];
    VC[dst] = Vn[id];
}

const MAX_GH: u32 = 8u;                      // query heads a workgroup may serve (GH <= MAX_GH)
override GH: u32 = 1u;                       // attend: query heads per workgroup, all of one KV head

var<workgroup> qs: array<f32, GH * HD>;
var<workgroup> p: array<f32, GH * WG>;
var<workgroup> red: array<f32, GH * WG>;

// Tree over the WG values of each of the GH heads in red[]; is_max: max, else sum. Holds barriers.
fn reduce_heads(lid: u32, is_max: bool) {
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            for (var g = 0u; g < GH; g++) {
                let a = red[g * WG + lid];
                let b = red[g * WG + lid + s];
                red[g * WG + lid] = select(a + b, max(a, b), is_max);
            }
        }
        workgroupBarrier();
    }
}

// attend: workgroup (x, t) serves query heads x*GH .. x*GH+GH-1 (one KV head) of token t, so each
// key and value row is read once for GH heads (GQA: up to 8 query heads share a KV head). Keys in
// chunks of WG with an online softmax per head; thread lid scores key c + lid against every head's
// query and owns output dims lid, lid + WG, ... (HD <= 4 WG). Dispatch (H / GH, T).
@compute @workgroup_size(WG)
fn attend(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h0 = wid.x * GH;
    let t = wid.y;
    let pos = S.pos0 + t;
    var last = select(pos, S.pos0 + S.n_tokens - 1u, ALL_KEYS);   // the last key it sees
    if (BLOCKS) { last = max(last, pos + KL[t]); }
    let kvh = h0 / (H / HKV);
    var lo = 0u;
    if (WINDOW > 0u && pos + 1u > WINDOW) { lo = pos + 1u - WINDOW; }
    for (var i = lid; i < GH * HD; i += WG) { qs[i] = Q[(t * H + h0) * HD + i] * SCALE; }
    workgroupBarrier();

    var m: array<f32, MAX_GH>;
    var l: array<f32, MAX_GH>;
    var acc: array<f32, 4 * MAX_GH>;         // [head g][dim slot i] at 4g + i
    for (var g = 0u; g < GH; g++) { m[g] = NEG; l[g] = 0.0; }
    for (var i = 0u; i < 4u * GH; i++) { acc[i] = 0.0; }
    for (var c = lo; c <= last; c += WG) {
        let j = c + lid;
        var score: array<f32, MAX_GH>;
        for (var g = 0u; g < GH; g++) { score[g] = NEG; }
        if (j <= last) {
            let kb = (kvh * CTX + j % CTX) * HD;
            for (var g = 0u; g < GH; g++) { score[g] = 0.0; }
            for (var d = 0u; d < HD; d++) {
                let k = KC[kb + d];
                for (var g = 0u; g < GH; g++) { score[g] += qs[g * HD + d] * k; }
            }
        }
        for (var g = 0u; g < GH; g++) { red[g * WG + lid] = score[g]; }
        reduce_heads(lid, true);
        var alpha: array<f32, MAX_GH>;
        for (var g = 0u; g < GH; g++) {
            let m_new = max(m[g], red[g * WG]);
            let e = select(0.0, exp(score[g] - m_new), j <= last);
            alpha[g] = exp(m[g] - m_new);
            m[g] = m_new;
            p[g * WG + lid] = e;
        }
        workgroupBarrier();                  // everyone has read red[] before it is reused
        for (var g = 0u; g < GH; g++) { red[g * WG + lid] = p[g * WG + lid]; }
        reduce_heads(lid, false);            // its barriers also publish p[]
        for (var g = 0u; g < GH; g++) { l[g] = l[g] * alpha[g] + red[g * WG]; }
        let n = min(WG, last + 1u - c);
        for (var i = 0u; i < 4u; i++) {
            let d = lid + i * WG;
            if (d < HD) {
                for (var g = 0u; g < GH; g++) { acc[4u * g + i] *= alpha[g]; }
                for (var jj = 0u; jj < n; jj++) {
                    let v = VC[(kvh * CTX + (c + jj) % CTX) * HD + d];
                    for (var g = 0u; g < GH; g++) { acc[4u * g + i] += p[g * WG + jj] * v; }
                }
            }
        }
        workgroupBarrier();
    }
    for (var g = 0u; g < GH; g++) {
        for (var i = 0u; i < 4u; i++) {
            let d = lid + i * WG;
            if (d < HD) { O[(t * H + h0 + g) * HD + d] = acc[4u * g + i] / l[g]; }
        }
    }
}
