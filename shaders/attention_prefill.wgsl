// Prefill attention in tiles (flash-attention style): a workgroup takes R query rows (the GH query
// heads of one KV head for R / GH consecutive tokens) and walks the keys BKV at a time with an
// online softmax, so each key and value row is read once per R rows rather than once per row, and
// the score matrix never leaves shared memory.
//
// Mirrors reference.forward attention like attention.wgsl `attend` (same inputs and layout):
// softmax(SCALE q k^T + mask) v over the keys each query sees (attention_rows.wgsl: causal, a window,
// every key, an image's block). Q, O: f32 [T, H, HD]; KC, VC: f32 [HKV, CTX, HD], position j in slot j % CTX.
//
// Per key tile: scores (thread lid: key lid % BKV, rows lid / BKV + 8i), K read in chunks of DCQ
// vec4 through shared memory; then each row's running max and sum (one thread a row); then
// P V, thread lid owning output dim lid (and lid + 256 where R = 16) of every row, reading V
// straight from the cache (coalesced, 4 keys' reads in flight together) and the probabilities as
// vec4 of 4 rows (a broadcast). The next K chunk's read is issued before the current one computes.
// R = 32 rows for HD <= 256, 16 for HD <= 512 (the queries, R * HD floats, stay in shared memory);
// R % GH == 0, HD % 4 == 0 (pyapp.gpu.kernels.attention checks). Dispatch (HKV, ceil(T / (R / GH))).

//!include attention_shape
//!include attention_rows
override R: u32 = 32u;         // query rows per workgroup: 32 or 16

@group(0) @binding(0) var<storage, read> Q: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> KC: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> VC: array<f32>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;

const NT: u32 = 256u;
const BKV: u32 = 32u;          // keys per tile
const DCQ: u32 = 8u;           // vec4 of K per shared chunk (NT / BKV: one load a thread)

var<workgroup> qt: array<vec4<f32>, R * HD / 4u>;     // [row][HD / 4] queries, times SCALE
var<workgroup> kt: array<vec4<f32>, DCQ * (BKV + 1u)>; // [vec4 of the chunk][key]
var<workgroup> st: array<f32, R * (BKV + 1u)>;        // [row][key] scores
var<workgroup> pt: array<vec4<f32>, BKV * R / 4u>;    // [key][4 rows] probabilities
var<workgroup> row_m: array<f32, R>;                  // running max, sum, and this tile's rescale
var<workgroup> row_l: array<f32, R>;
var<workgroup> row_a: array<f32, R>;

fn alpha4(q: u32) -> vec4<f32> {
    return vec4<f32>(row_a[4u * q], row_a[4u * q + 1u], row_a[4u * q + 2u], row_a[4u * q + 3u]);
}

// Key j's values at this thread's dims: (lid, lid + NT where R = 16, else lid again); 0 past HD.
fn v_pair(kvh: u32, j: u32, lid: u32) -> vec2<f32> {
    let vrow = (kvh * CTX + j % CTX) * HD;
    let a = select(0.0, VC[vrow + min(lid, HD - 1u)], lid < HD);
    if (R == 16u) { return vec2<f32>(a, select(0.0, VC[vrow + min(lid + NT, HD - 1u)], lid + NT < HD)); }
    return vec2<f32>(a);
}

// acc += this key's probabilities (pt[pq ..], vec4 of 4 rows) times its values.
fn pv_key(acc: ptr<function, array<vec4<f32>, 8>>, pq: u32, half: u32, v: vec2<f32>) {
    let a = vec4<f32>(v.x);
    let b = vec4<f32>(v.y);
    (*acc)[0] = fma(pt[pq], a, (*acc)[0]);
    (*acc)[1] = fma(pt[pq + 1u], a, (*acc)[1]);
    (*acc)[2] = fma(pt[pq + 2u], a, (*acc)[2]);
    (*acc)[3] = fma(pt[pq + 3u], a, (*acc)[3]);
    (*acc)[4] = fma(pt[pq + half], b, (*acc)[4]);
    (*acc)[5] = fma(pt[pq + half + 1u], b, (*acc)[5]);
    (*acc)[6] = fma(pt[pq + half + 2u], b, (*acc)[6]);
    (*acc)[7] = fma(pt[pq + half + 3u], b, (*acc)[7]);
}

// Output slot q (4 rows, one dim) to O.
fn write_rows(q: u32, d: u32, acc: vec4<f32>, t0: u32, kvh: u32) {
    if (d >= HD) { return; }
    for (var c = 0u; c < 4u; c++) {
        let r = 4u * q + c;
        let t = t0 + r / GH;
        if (t < S.n_tokens) { O[(t * H + kvh * GH + r % GH) * HD + d] = acc[c] / row_l[r]; }
    }
}

@compute @workgroup_size(NT)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let hd4 = HD / 4u;
    let kvh = wid.x;
    let t0 = wid.y * (R / GH);
    if (t0 >= S.n_tokens) { return; }               // the plan is sized for its longest step
    let keys = key_range(t0, R);
    let lo = keys.x;                                // the first key any row sees
    let hi = keys.y;                                // the last
    for (var i = lid; i < R * hd4; i += NT) {
        let r = i / hd4;
        let t = min(t0 + r / GH, S.n_tokens - 1u);
        qt[i] = Q[(t * H + kvh * GH + r % GH) * hd4 + i % hd4] * SCALE;
    }
    if (lid < R) {
        row_m[lid] = NEG;
        row_l[lid] = 0.0;
    }
    let sj = lid % BKV;
    let sr = lid / BKV;
    let rq = R / 4u;
    let half = select(4u, 0u, R == 16u);            // slots 4..7: row quads 4..7 (R = 32) or 0..3 at dim + 256
    var acc: array<vec4<f32>, 8>;                   // slots: indexed by constants only (registers)
    workgroupBarrier();
    for (var k0 = lo; k0 <= hi; k0 += BKV) {
        // scores of this thread's key against its rows, K through shared memory a chunk at a time
        var s0 = 0.0;
        var s1 = 0.0;
        var s2 = 0.0;
        var s3 = 0.0;
        let key = lid / DCQ;                       // the key and vec4 of each chunk this thread loads
        let dq = lid % DCQ;
        let krow = (kvh * CTX + min(k0 + key, hi) % CTX) * hd4;
        let kok = k0 + key <= hi;
        var kv = select(vec4<f32>(0.0), KC[krow + min(dq, hd4 - 1u)], kok && dq < hd4);
        for (var d0 = 0u; d0 < hd4; d0 += DCQ) {
            kt[dq * (BKV + 1u) + key] = kv;
            workgroupBarrier();
            let dn = d0 + DCQ + dq;                  // the next chunk's read, in flight while this one computes
            kv = select(vec4<f32>(0.0), KC[krow + min(dn, hd4 - 1u)], kok && dn < hd4);
            for (var c = 0u; c < DCQ; c++) {
                let kk = kt[c * (BKV + 1u) + sj];
                let d = min(d0 + c, hd4 - 1u);       // past HD the key chunk is zeros
                s0 += dot(qt[sr * hd4 + d], kk);
                s1 += dot(qt[(sr + 8u) * hd4 + d], kk);
                if (R == 32u) {
                    s2 += dot(qt[(sr + 16u) * hd4 + d], kk);
                    s3 += dot(qt[(sr + 24u) * hd4 + d], kk);
                }
            }
            workgroupBarrier();
        }
        let j = k0 + sj;
        st[sr * (BKV + 1u) + sj] = masked(s0, sr, j, t0);
        st[(sr + 8u) * (BKV + 1u) + sj] = masked(s1, sr + 8u, j, t0);
        if (R == 32u) {
            st[(sr + 16u) * (BKV + 1u) + sj] = masked(s2, sr + 16u, j, t0);
            st[(sr + 24u) * (BKV + 1u) + sj] = masked(s3, sr + 24u, j, t0);
        }
        workgroupBarrier();
        // online softmax: row lid's new max, its rescale, probabilities (over its scores) and sum
        if (lid < R) {
            let m_old = row_m[lid];
            var m = m_old;
            for (var c = 0u; c < BKV; c++) { m = max(m, st[lid * (BKV + 1u) + c]); }
            var sum = 0.0;
            for (var c = 0u; c < BKV; c++) {
                let s = st[lid * (BKV + 1u) + c];
                let p = select(0.0, exp(s - m), s > 0.5 * NEG);
                st[lid * (BKV + 1u) + c] = p;
                sum += p;
            }
            let a = exp(m_old - m);                 // 1 while both are NEG (nothing accumulated yet)
            row_a[lid] = a;
            row_l[lid] = row_l[lid] * a + sum;
            row_m[lid] = m;
        }
        workgroupBarrier();
        // the probabilities as vec4 of 4 rows a key, each written whole by one thread (writes of a shared
        // vec4's components by several invocations are a data race in WGSL: gpuweb#2112)
        if (lid < BKV * rq) {
            let c = lid / rq;
            let r = 4u * (lid % rq);
            pt[lid] = vec4<f32>(st[r * (BKV + 1u) + c], st[(r + 1u) * (BKV + 1u) + c],
                                st[(r + 2u) * (BKV + 1u) + c], st[(r + 3u) * (BKV + 1u) + c]);
        }
        workgroupBarrier();
        // P V: this thread's output dim(s) for every row
        acc[0] *= alpha4(0u);
        acc[1] *= alpha4(1u);
        acc[2] *= alpha4(2u);
        acc[3] *= alpha4(3u);
        acc[4] *= alpha4(half);
        acc[5] *= alpha4(half + 1u);
        acc[6] *= alpha4(half + 2u);
        acc[7] *= alpha4(half + 3u);
        // all BKV keys, four keys' V reads issued together (keys past hi have probability 0: clamped reads)
        for (var j0 = 0u; j0 < BKV; j0 += 4u) {
            let v0 = v_pair(kvh, min(k0 + j0, hi), lid);
            let v1 = v_pair(kvh, min(k0 + j0 + 1u, hi), lid);
            let v2 = v_pair(kvh, min(k0 + j0 + 2u, hi), lid);
            let v3 = v_pair(kvh, min(k0 + j0 + 3u, hi), lid);
            pv_key(&acc, j0 * rq, half, v0);
            pv_key(&acc, (j0 + 1u) * rq, half, v1);
            pv_key(&acc, (j0 + 2u) * rq, half, v2);
            pv_key(&acc, (j0 + 3u) * rq, half, v3);
        }
        workgroupBarrier();                         // before the next tile's scores overwrite st, pt
    }
    let d2 = select(lid, lid + NT, R == 16u);       // slots 4..7's dim
    write_rows(0u, lid, acc[0], t0, kvh);
    write_rows(1u, lid, acc[1], t0, kvh);
    write_rows(2u, lid, acc[2], t0, kvh);
    write_rows(3u, lid, acc[3], t0, kvh);
    write_rows(half, d2, acc[4], t0, kvh);
    write_rows(half + 1u, d2, acc[5], t0, kvh);
    write_rows(half + 2u, d2, acc[6], t0, kvh);
    write_rows(half + 3u, d2, acc[7], t0, kvh);
}
