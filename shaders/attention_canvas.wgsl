// DiffusionGemma decoder attention: every canvas query sees the cached prefix and the whole canvas,
// unmasked, and nothing is written to the cache.
//
// Mirrors reference.diffusion.DecoderView: softmax(SCALE * q k^T) v over the keys
// [prefix positions lo .. P-1 from the cache] ++ [the T canvas keys], P = S.pos0, T = S.n_tokens
// (S: Step, the per-step uniform from the prelude pyapp.gpu.kernels generates).
//   lo = max(P - KEEP, 0) when KEEP > 0 (sliding layers: the encoder's cache keeps the last
//   window - 1 positions), else 0 (global layers: the whole prefix).
// Q, O: f32 [T, H, HD]; Kn, Vn: the canvas keys and values f32 [T, HKV, HD] (normed, roped);
// KC, VC: the encoder's cache f32 [HKV, CTX, HD], position j in slot j % CTX.
// Query head h reads kv head h / (H / HKV).
// attend_canvas: one workgroup per (head, canvas token); keys in chunks of WG, one a thread, with an
// online softmax; each thread owns output dims lid, lid + WG, ... (HD <= 4 WG). Dispatch (H, T).

//!include attention_shape
override KEEP: u32 = 0u;
override WG: u32 = 128u;

@group(0) @binding(0) var<storage, read> Q: array<f32>;
@group(0) @binding(1) var<storage, read> KC: array<f32>;
@group(0) @binding(2) var<storage, read> VC: array<f32>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;
@group(0) @binding(4) var<uniform> S: Step;
@group(0) @binding(5) var<storage, read> Kn: array<f32>;
@group(0) @binding(6) var<storage, read> Vn: array<f32>;


var<workgroup> qs: array<f32, HD>;
var<workgroup> p: array<f32, WG>;
//!include workgroup_reduce

// Where key i of the query's list lives: element base of its row in KC/VC (prefix) or Kn/Vn (canvas).
fn key_row(i: u32, n_prefix: u32, lo: u32, kvh: u32) -> u32 {
    if (i < n_prefix) { return (kvh * CTX + (lo + i) % CTX) * HD; }
    return ((i - n_prefix) * HKV + kvh) * HD;
}

@compute @workgroup_size(WG)
fn attend_canvas(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let t = wid.y;
    let P = S.pos0;
    let T = S.n_tokens;
    if (t >= T) { return; }                  // uniform per workgroup
    let kvh = h / (H / HKV);
    var lo = 0u;
    if (KEEP > 0u && P > KEEP) { lo = P - KEEP; }
    let n_prefix = P - lo;
    let n = n_prefix + T;
    let qb = (t * H + h) * HD;
    for (var d = lid; d < HD; d += WG) { qs[d] = Q[qb + d] * SCALE; }
    workgroupBarrier();

    var m = NEG;
    var l = 0.0;
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    for (var c = 0u; c < n; c += WG) {
        let i = c + lid;
        var s = NEG;
        if (i < n) {
            let kb = key_row(i, n_prefix, lo, kvh);
            var dotv = 0.0;
            if (i < n_prefix) {
                for (var d = 0u; d < HD; d++) { dotv += qs[d] * KC[kb + d]; }
            } else {
                for (var d = 0u; d < HD; d++) { dotv += qs[d] * Kn[kb + d]; }
            }
            s = dotv;
        }
        red[lid] = s;
        let m_new = max(m, reduce(lid, true));
        let e = select(0.0, exp(s - m_new), i < n);
        p[lid] = e;
        red[lid] = e;
        let alpha = exp(m - m_new);
        l = l * alpha + reduce(lid, false);     // the barriers in reduce also publish p[]
        let nc = min(WG, n - c);
        for (var k = 0u; k < 4u; k++) {
            let d = lid + k * WG;
            if (d < HD) {
                var a = acc[k] * alpha;
                for (var jj = 0u; jj < nc; jj++) {
                    let vb = key_row(c + jj, n_prefix, lo, kvh);
                    if (c + jj < n_prefix) { a += p[jj] * VC[vb + d]; } else { a += p[jj] * Vn[vb + d]; }
                }
                acc[k] = a;
            }
        }
        workgroupBarrier();
        m = m_new;
    }
    for (var k = 0u; k < 4u; k++) {
        let d = lid + k * WG;
        if (d < HD) { O[qb + d] = acc[k] / l; }
    }
}
