// Attention backward for training: the probabilities recomputed from Q and K, never stored.
//
// Mirrors pyapp.reference.backward.attention_backward (softmax(SCALE q k^T) v, GQA, causal [+ window]):
//   P[h, i, j] = softmax_j(SCALE q_i,h . k_j,g) over allowed j (j <= i, and i - j < WINDOW when WINDOW > 0),
//   g = h / (H / HKV);  dp_ij = dO_i,h . v_j,g;  D_i,h = sum_j P_ij dp_ij;  ds_ij = P_ij (dp_ij - D_i,h)
//   dQ_i,h = SCALE sum_j ds_ij k_j;  dK_j,g = SCALE sum_{h of g} sum_i ds_ij q_i,h;  dV_j,g = sum_{h of g} sum_i P_ij dO_i,h
// Q, dO, dQ: f32 [T, H, HD] (q after its norm and RoPE); K, V, dK, dV: f32 [HKV, CTX, HD] (the cache
// layout; key j is token j of the step: training runs whole sequences from position 0). ST: scratch
// f32 [T, H, 2] (each row's log-sum-exp and D). ACC: dK, dV are added into (a KV-sharing layer's
// cache gets the gradients of every layer that reads it). T = S.n_tokens (the per-step uniform).
// Entry points, in this order (each O(T^2 HD): plain loops, no tiling yet):
//   stats: workgroup (h, i): threads over keys: scores, max, sum, D. Dispatch (H, T).
//   dq:    workgroup (h, i): per block of WG keys, each thread one key's ds into shared memory, then
//          each thread its HD / WG dims of dQ. Dispatch (H, T).
//   dkv:   workgroup (h, j): one query head's part of key j's dK and dV (per block of WG queries,
//          each thread one query's P_ij and ds_ij into shared memory, then its dims), into the
//          scratch DKVP [2, H, CTX, HD]. Dispatch (H, T): a workgroup per query head, not per KV head
//          (E2B has one KV head: T workgroups alone leave most of a big GPU idle).
//   dkv_sum: thread per (g, j, dim): dK, dV = the sums of DKVP over g's query heads (ACC: added).
//          Dispatch: ceil(HKV * T * HD / WG) workgroups (split above 65535).

//!include attention_shape
override WINDOW: u32 = 0u;
override ACC: bool = false;
override WG: u32 = 64u;

@group(0) @binding(0) var<storage, read> Q: array<f32>;
@group(0) @binding(1) var<storage, read> K: array<f32>;
@group(0) @binding(2) var<storage, read> V: array<f32>;
@group(0) @binding(3) var<storage, read> DO: array<f32>;
@group(0) @binding(4) var<storage, read_write> ST: array<f32>;
@group(0) @binding(5) var<storage, read_write> DQ: array<f32>;
@group(0) @binding(6) var<storage, read_write> DK: array<f32>;
@group(0) @binding(7) var<storage, read_write> DV: array<f32>;
@group(0) @binding(8) var<uniform> S: Step;
@group(0) @binding(9) var<storage, read_write> DKVP: array<f32>;

const DPT: u32 = 8u;                        // dims a thread accumulates: HD <= 8 WG
var<workgroup> ws_p: array<f32, WG>;
var<workgroup> ws_s: array<f32, WG>;

//!include workgroup_sum

fn first_key(i: u32) -> u32 {               // the first key query i sees
    if (WINDOW > 0u && i + 1u > WINDOW) { return i + 1u - WINDOW; }
    return 0u;
}

fn score(qa: u32, kb: u32) -> f32 {         // SCALE q . k for the rows at qa (Q) and kb (K)
    var s = 0.0;
    for (var d = 0u; d < HD; d++) { s += Q[qa + d] * K[kb + d]; }
    return SCALE * s;
}

fn dp(qa: u32, kb: u32) -> f32 {            // dO . v for the rows at qa (dO) and kb (V)
    var s = 0.0;
    for (var d = 0u; d < HD; d++) { s += DO[qa + d] * V[kb + d]; }
    return s;
}

@compute @workgroup_size(WG)
fn stats(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let i = wid.y;
    if (i >= S.n_tokens) { return; }
    let g = h / (H / HKV);
    let qa = (i * H + h) * HD;
    let j0 = first_key(i);
    var m = NEG;
    for (var j = j0 + lid; j <= i; j += WG) { m = max(m, score(qa, (g * CTX + j) * HD)); }
    m = workgroup_max(lid, m);
    var l = 0.0;
    var dsum = 0.0;
    for (var j = j0 + lid; j <= i; j += WG) {
        let kb = (g * CTX + j) * HD;
        let e = exp(score(qa, kb) - m);
        l += e;
        dsum += e * dp(qa, kb);
    }
    l = workgroup_sum(lid, l);
    dsum = workgroup_sum(lid, dsum);
    if (lid == 0u) {
        ST[2u * (i * H + h)] = m + log(l);
        ST[2u * (i * H + h) + 1u] = dsum / l;
    }
}

@compute @workgroup_size(WG)
fn dq(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let i = wid.y;
    if (i >= S.n_tokens) { return; }
    let g = h / (H / HKV);
    let qa = (i * H + h) * HD;
    let lse = ST[2u * (i * H + h)];
    let dd = ST[2u * (i * H + h) + 1u];
    var acc: array<f32, DPT>;
    for (var jb = first_key(i); jb <= i; jb += WG) {
        let j = jb + lid;
        var ds = 0.0;
        if (j <= i) {
            let kb = (g * CTX + j) * HD;
            let p = exp(score(qa, kb) - lse);
            ds = p * (dp(qa, kb) - dd);
        }
        ws_s[lid] = ds;
        workgroupBarrier();
        let n = min(WG, i + 1u - jb);
        for (var c = 0u; c < DPT; c++) {
            let d = lid + c * WG;
            if (d < HD) {
                for (var jj = 0u; jj < n; jj++) { acc[c] += ws_s[jj] * K[(g * CTX + jb + jj) * HD + d]; }
            }
        }
        workgroupBarrier();
    }
    for (var c = 0u; c < DPT; c++) {
        let d = lid + c * WG;
        if (d < HD) { DQ[qa + d] = SCALE * acc[c]; }
    }
}

@compute @workgroup_size(WG)
fn dkv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let j = wid.y;
    let T = S.n_tokens;
    if (j >= T) { return; }
    let g = h / (H / HKV);
    let kb = (g * CTX + j) * HD;
    var last = T;                                   // queries j .. last - 1 see key j
    if (WINDOW > 0u) { last = min(T, j + WINDOW); }
    var ak: array<f32, DPT>;
    var av: array<f32, DPT>;
    for (var ib = j; ib < last; ib += WG) {
        let i = ib + lid;
        var p = 0.0;
        var ds = 0.0;
        if (i < last) {
            let qa = (i * H + h) * HD;
            p = exp(score(qa, kb) - ST[2u * (i * H + h)]);
            ds = p * (dp(qa, kb) - ST[2u * (i * H + h) + 1u]);
        }
        ws_p[lid] = p;
        ws_s[lid] = ds;
        workgroupBarrier();
        let n = min(WG, last - ib);
        for (var c = 0u; c < DPT; c++) {
            let d = lid + c * WG;
            if (d < HD) {
                for (var ii = 0u; ii < n; ii++) {
                    let qa = ((ib + ii) * H + h) * HD + d;
                    ak[c] += ws_s[ii] * Q[qa];
                    av[c] += ws_p[ii] * DO[qa];
                }
            }
        }
        workgroupBarrier();
    }
    let pb = (h * CTX + j) * HD;
    for (var c = 0u; c < DPT; c++) {
        let d = lid + c * WG;
        if (d < HD) {
            DKVP[pb + d] = SCALE * ak[c];
            DKVP[H * CTX * HD + pb + d] = av[c];
        }
    }
}

@compute @workgroup_size(WG)
fn dkv_sum(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = gid.x + gid.y * nwg.x * WG;
    let d = id % HD;
    let j = (id / HD) % CTX;
    let g = id / (HD * CTX);
    if (g >= HKV || j >= S.n_tokens) { return; }
    let group = H / HKV;
    var dk = 0.0;
    var dv = 0.0;
    for (var hh = 0u; hh < group; hh++) {
        let pb = (((g * group + hh) * CTX + j) * HD) + d;
        dk += DKVP[pb];
        dv += DKVP[H * CTX * HD + pb];
    }
    let kb = (g * CTX + j) * HD + d;
    if (ACC) { DK[kb] += dk; DV[kb] += dv; } else { DK[kb] = dk; DV[kb] = dv; }
}
