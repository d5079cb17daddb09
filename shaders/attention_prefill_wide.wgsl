// Prefill attention for wide heads (HD 384-512: Gemma 4's full-attention layers), register-blocked: the
// same contract, inputs and masks as attention_prefill.wgsl (whose 16-row tiles this replaces there), but
// both products of a key tile run as small matrix products with 16 outputs a thread, so that each value
// read from shared memory feeds several multiply-adds, and a workgroup takes 32 query rows (four tokens of
// an 8-head GQA group rather than two), so the keys and values are read half as often.
//
// A workgroup: RT = 32 query rows (the GH query heads of one KV head for RT / GH consecutive tokens), keys
// in tiles of BK = 128, 256 threads.
//   scores   S = Q K^T (32 x 128): thread lid owns rows rb + 8i and keys kb + 32j (i, j < 4; rb = lid / 32,
//            kb = lid % 32); Q and K pass through shared memory DC vec4 at a time (the next chunk's reads
//            in flight while this one computes).
//   softmax  each row's max and sum over the tile from its 32 threads' partials (shared memory); the
//            running max and sum live in those threads' registers; probabilities to shared memory as
//            [key][4 rows].
//   P V      thread lid owns rows 4q .. 4q + 3 (q = lid / 32) and dims 16 db .. 16 db + 15 (db = lid % 32):
//            16 vec4 accumulators; a warp reads one value row whole (2 KB, coalesced), two keys in flight.
// Needs HD % 128 == 0 and HD <= 512 (HD / 32 dims a thread, at most 4 vec4), RT % GH == 0
// (pyapp.gpu.kernels.attention checks). Dispatch (HKV, ceil(T / (RT / GH))).

//!include attention_shape
//!include attention_rows

@group(0) @binding(0) var<storage, read> Q: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> KC: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> VC: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> O: array<vec4<f32>>;

const NT: u32 = 256u;
const RT: u32 = 32u;           // query rows a workgroup
const BK: u32 = 128u;          // keys a tile
const DC: u32 = 4u;            // vec4 of Q and K a shared chunk (a Q read for half the threads, two K reads a thread)

var<workgroup> qs: array<vec4<f32>, DC * RT>;          // [vec4 of the chunk][row], times SCALE
var<workgroup> ks: array<vec4<f32>, DC * (BK + 1u)>;   // [vec4 of the chunk][key]
var<workgroup> pt: array<vec4<f32>, BK * RT / 4u>;     // [key][4 rows] probabilities
var<workgroup> red: array<f32, RT * 32u>;              // [row][kb] partial maxima, then partial sums
var<workgroup> row_a: array<f32, RT>;                  // this tile's rescale of each row, then its sum

// Row r's query vec4 d (times SCALE): its token clamped into the step (rows past it are masked).
fn q_read(r: u32, d: u32, t0: u32, kvh: u32) -> vec4<f32> {
    let t = min(t0 + r / GH, S.n_tokens - 1u);
    return Q[(t * H + kvh * GH + r % GH) * (HD / 4u) + d] * SCALE;
}

// Key j's vec4 d, zeros past the last key any row sees.
fn k_read(kvh: u32, j: u32, hi: u32, d: u32) -> vec4<f32> {
    return select(vec4<f32>(0.0), KC[(kvh * CTX + min(j, hi) % CTX) * (HD / 4u) + d], j <= hi);
}

// acc[4 r + i] += p[r] * v[i]: four rows times this thread's (up to) 16 dims of one key.
fn pv(acc: ptr<function, array<vec4<f32>, 16>>, p: vec4<f32>, v: array<vec4<f32>, 4>) {
    (*acc)[0] = fma(vec4<f32>(p.x), v[0], (*acc)[0]);
    (*acc)[1] = fma(vec4<f32>(p.x), v[1], (*acc)[1]);
    (*acc)[2] = fma(vec4<f32>(p.x), v[2], (*acc)[2]);
    (*acc)[3] = fma(vec4<f32>(p.x), v[3], (*acc)[3]);
    (*acc)[4] = fma(vec4<f32>(p.y), v[0], (*acc)[4]);
    (*acc)[5] = fma(vec4<f32>(p.y), v[1], (*acc)[5]);
    (*acc)[6] = fma(vec4<f32>(p.y), v[2], (*acc)[6]);
    (*acc)[7] = fma(vec4<f32>(p.y), v[3], (*acc)[7]);
    (*acc)[8] = fma(vec4<f32>(p.z), v[0], (*acc)[8]);
    (*acc)[9] = fma(vec4<f32>(p.z), v[1], (*acc)[9]);
    (*acc)[10] = fma(vec4<f32>(p.z), v[2], (*acc)[10]);
    (*acc)[11] = fma(vec4<f32>(p.z), v[3], (*acc)[11]);
    (*acc)[12] = fma(vec4<f32>(p.w), v[0], (*acc)[12]);
    (*acc)[13] = fma(vec4<f32>(p.w), v[1], (*acc)[13]);
    (*acc)[14] = fma(vec4<f32>(p.w), v[2], (*acc)[14]);
    (*acc)[15] = fma(vec4<f32>(p.w), v[3], (*acc)[15]);
}

// Key j's values at this thread's dims (vec4 db * V4 ..): V4 = HD / 128 of them, zeros after.
fn v_read(kvh: u32, j: u32, db: u32) -> array<vec4<f32>, 4> {
    let v4 = HD / 128u;
    let base = (kvh * CTX + j % CTX) * (HD / 4u) + db * v4;
    var v: array<vec4<f32>, 4>;
    v[0] = VC[base];
    v[1] = select(vec4<f32>(0.0), VC[base + min(1u, v4 - 1u)], v4 > 1u);
    v[2] = select(vec4<f32>(0.0), VC[base + min(2u, v4 - 1u)], v4 > 2u);
    v[3] = select(vec4<f32>(0.0), VC[base + min(3u, v4 - 1u)], v4 > 3u);
    return v;
}

// Row r of the tile's rows: output vec4 d = acc / the row's sum.
fn write_row(r: u32, d: u32, acc: vec4<f32>, t0: u32, kvh: u32) {
    let t = t0 + r / GH;
    if (t < S.n_tokens) { O[(t * H + kvh * GH + r % GH) * (HD / 4u) + d] = acc / row_a[r]; }
}

@compute @workgroup_size(NT)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let hd4 = HD / 4u;
    let v4 = HD / 128u;
    let kvh = wid.x;
    let t0 = wid.y * (RT / GH);
    if (t0 >= S.n_tokens) { return; }               // the plan is sized for its longest step
    let keys = key_range(t0, RT);
    let lo = keys.x;                                // the first key any row sees
    let hi = keys.y;                                // the last

    let rb = lid / 32u;                             // scores: rows rb + 8i, keys kb + 32j
    let kb = lid % 32u;
    let lr = lid / DC;                              // chunk loads: Q row lr (lr < RT), keys lr and lr + 64, vec4 lc
    let lc = lid % DC;
    let q = lid / 32u;                              // P V: rows 4q .. 4q + 3, dims of vec4 db * V4 ..
    let db = lid % 32u;
    var m: array<f32, 4>;                           // running max and sum of rows rb + 8i
    var l: array<f32, 4>;
    for (var i = 0u; i < 4u; i++) {
        m[i] = NEG;
        l[i] = 0.0;
    }
    var acc: array<vec4<f32>, 16>;                  // indexed by constants only (registers)
    for (var k0 = lo; k0 <= hi; k0 += BK) {
        // scores: s[4i + j] of row rb + 8i against key kb + 32j
        var s: array<f32, 16>;
        s = array<f32, 16>();                       // zeroed by a statement: a declaration's zero may be hoisted out of the loop
        var qv = q_read(min(lr, RT - 1u), lc, t0, kvh);
        var ka = k_read(kvh, k0 + lr, hi, lc);
        var kz = k_read(kvh, k0 + lr + 64u, hi, lc);
        for (var d0 = 0u; d0 < hd4; d0 += DC) {
            if (lr < RT) { qs[lc * RT + lr] = qv; }
            ks[lc * (BK + 1u) + lr] = ka;
            ks[lc * (BK + 1u) + lr + 64u] = kz;
            workgroupBarrier();
            let dn = min(d0 + DC, hd4 - DC) + lc;   // the next chunk's reads (the last chunk reads itself again)
            qv = q_read(min(lr, RT - 1u), dn, t0, kvh);
            ka = k_read(kvh, k0 + lr, hi, dn);
            kz = k_read(kvh, k0 + lr + 64u, hi, dn);
            for (var c = 0u; c < DC; c++) {
                var qr: array<vec4<f32>, 4>;
                var kr: array<vec4<f32>, 4>;
                for (var i = 0u; i < 4u; i++) { qr[i] = qs[c * RT + rb + 8u * i]; }
                for (var j = 0u; j < 4u; j++) { kr[j] = ks[c * (BK + 1u) + kb + 32u * j]; }
                for (var i = 0u; i < 4u; i++) {
                    for (var j = 0u; j < 4u; j++) { s[4u * i + j] += dot(qr[i], kr[j]); }
                }
            }
            workgroupBarrier();
        }
        // masks, then each row's tile max from its 32 threads
        for (var i = 0u; i < 4u; i++) {
            var mx = NEG;
            for (var j = 0u; j < 4u; j++) {
                s[4u * i + j] = masked(s[4u * i + j], rb + 8u * i, k0 + kb + 32u * j, t0);
                mx = max(mx, s[4u * i + j]);
            }
            red[(rb + 8u * i) * 32u + kb] = mx;
        }
        workgroupBarrier();
        var a: array<f32, 4>;                       // each row's rescale of what it has accumulated
        var n: array<f32, 4>;                       // and its new max
        for (var i = 0u; i < 4u; i++) {
            var mx = m[i];
            for (var k = 0u; k < 32u; k++) { mx = max(mx, red[(rb + 8u * i) * 32u + k]); }
            n[i] = mx;
        }
        workgroupBarrier();                         // every max read before red takes the sums
        for (var i = 0u; i < 4u; i++) {
            let mx = n[i];
            // probabilities (0 where masked) into pt[key][row quad], their partial sums
            var sum = 0.0;
            for (var j = 0u; j < 4u; j++) {
                let e = s[4u * i + j];
                let pr = select(0.0, exp(e - mx), e > 0.5 * NEG);
                pt[(kb + 32u * j) * (RT / 4u) + (rb + 8u * i) / 4u][rb % 4u] = pr;
                sum += pr;
            }
            red[(rb + 8u * i) * 32u + kb] = sum;
            a[i] = exp(m[i] - mx);                  // 1 while both are NEG (nothing accumulated yet)
            m[i] = mx;
            if (kb == 0u) { row_a[rb + 8u * i] = a[i]; }
        }
        workgroupBarrier();
        for (var i = 0u; i < 4u; i++) {
            var sum = 0.0;
            for (var k = 0u; k < 32u; k++) { sum += red[(rb + 8u * i) * 32u + k]; }
            l[i] = l[i] * a[i] + sum;
        }
        // P V: rescale rows 4q .. 4q + 3, then every key of the tile, two keys' values in flight
        let ra = vec4<f32>(row_a[4u * q], row_a[4u * q + 1u], row_a[4u * q + 2u], row_a[4u * q + 3u]);
        for (var i = 0u; i < 4u; i++) {
            acc[i] *= ra.x;
            acc[4u + i] *= ra.y;
            acc[8u + i] *= ra.z;
            acc[12u + i] *= ra.w;
        }
        let kn = min(BK, hi + 1u - k0);           // keys of this tile any row sees
        var j = 0u;
        for (; j + 1u < kn; j += 2u) {
            let va = v_read(kvh, k0 + j, db);
            let vb = v_read(kvh, k0 + j + 1u, db);
            pv(&acc, pt[j * (RT / 4u) + q], va);
            pv(&acc, pt[(j + 1u) * (RT / 4u) + q], vb);
        }
        if (j < kn) { pv(&acc, pt[j * (RT / 4u) + q], v_read(kvh, k0 + j, db)); }
        // (the next tile writes red, pt and row_a only after its scores' barriers)
    }
    workgroupBarrier();                             // every thread done reading row_a's rescales
    if (kb == 0u) {
        for (var i = 0u; i < 4u; i++) { row_a[rb + 8u * i] = l[i]; }
    }
    workgroupBarrier();
    for (var i = 0u; i < 4u; i++) {
        if (i < v4) {
            write_row(4u * q, db * v4 + i, acc[i], t0, kvh);
            write_row(4u * q + 1u, db * v4 + i, acc[4u + i], t0, kvh);
            write_row(4u * q + 2u, db * v4 + i, acc[8u + i], t0, kvh);
            write_row(4u * q + 3u, db * v4 + i, acc[12u + i], t0, kvh);
        }
    }
}
