// Prefill attention for wide heads (HD 128-512 in 128s; Gemma 4's are 256 and 512), register-blocked: the same
// contract, inputs and masks as attention_prefill.wgsl (whose 32- and 16-row tiles this replaces there), but
// both products of a key tile run as small matrix products with 16 outputs a thread, so that each value
// read from shared memory feeds several multiply-adds, and a workgroup takes 32 query rows (four tokens of
// an 8-head GQA group rather than two), so the keys and values are read half as often.
//
// A workgroup: RT = 32 query rows (the GH query heads of one KV head for RT / GH consecutive tokens), keys
// in tiles of BK = 128, 256 threads. A long prompt's chunk makes about one workgroup an SM, so what bounds
// the tile is how long its threads wait on memory: each phase keeps as many loads in flight as it can.
//   scores   S = Q K^T (32 x 128): thread lid owns rows rb + 8i and keys kb + 32j (i, j < 4), a warp 4
//            rows rb by 8 keys kb, so that each of its shared-memory reads is one 128-byte wavefront (32
//            rows by 1 key or 1 row by 32 keys take 4 or 1 and 4); Q and K pass through shared memory
//            DC = 8 vec4 at a time (the next chunk's reads in flight while this one computes: 5 vec4 a
//            thread).
//   softmax  each row's max and sum over the tile from its 32 threads' partials (shared memory); the
//            running max and sum live in those threads' registers; probabilities to shared memory as
//            [key][quad q: rows q, q + 8, q + 16, q + 24], over the K chunk's storage (the scores are done
//            with it): each thread writes whole vec4 (WGSL makes two invocations writing components of one
//            vector a data race, and Metal's and D3D's compilers may store the whole vector).
//   P V      thread lid owns quads QG g .. QG g + QG - 1 (QG = PR / 4 of them: PR rows; g = lid / PT) and
//            dims 4e .. 4e + 3 (e = lid % PT): PR = 16 rows over PT = 128 threads for heads wider than 256,
//            else as many threads as the head has vec4 (8 rows for 256, 4 for 128); PR vec4 accumulators;
//            the values of the next VF = 16 keys in flight (a ring of registers, each slot reloaded as soon
//            as its key is used).
// On an H200 at 15,872 keys (E2B's full layer) the P V with two keys in flight and 4 rows x 16 dims a
// thread took 6.1 of the tile's 9.9 ms, waiting on its loads; the ring and the 16 x 4 layout made the tile
// 6.0 ms, the 8-vec4 chunks (4 before: 64 barriers a tile, now 32) 5.4, the multiply-add chains and the
// slots by one wrap 5.0 (bench/RESULTS.md, 2026-11-28, thirteenth session).
// Needs HD % 128 == 0 and HD <= 512 (at most a vec4 of dims a P V thread), RT % GH == 0
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
const DC: u32 = 8u;            // vec4 of Q and K a shared chunk
const KROWS: u32 = NT / DC;    // keys a chunk load pass covers: a thread loads keys lr + KROWS p (p < KP)
const KP: u32 = BK / KROWS;
const VF: u32 = 16u;           // keys whose values are in flight during P V
override PR: u32 = select(RT * HD / (4u * NT), 16u, HD > 256u);   // P V rows a thread
override PT: u32 = NT * PR / RT;                                  // P V threads across the dims
override QG: u32 = PR / 4u;                                       // P V quads of rows a thread

var<workgroup> qs: array<vec4<f32>, DC * (RT + 1u)>;   // [vec4 of the chunk][row] (padded), times SCALE
// the scores' K chunk, [vec4 of the chunk][key] (a key's row padded to BK + 1), then the probabilities
// [key][4 rows]: one array, as the two are never used at once
var<workgroup> kp: array<vec4<f32>, max(DC * (BK + 1u), BK * RT / 4u)>;
var<workgroup> red: array<f32, RT * 33u>;              // [row][kb] (padded) partial maxima, then partial sums
var<workgroup> row_a: array<f32, RT>;                  // this tile's rescale of each row, then its sum

// s + a . b as a chain of multiply-adds: an instruction less than dot() then +, for about twice its rounding
// of the running sum (f32's still; the tests' tolerances grow with the head)
fn dot4_add(a: vec4<f32>, b: vec4<f32>, s: f32) -> f32 {
    return fma(a.w, b.w, fma(a.z, b.z, fma(a.y, b.y, fma(a.x, b.x, s))));
}

// Row r's query vec4 d (times SCALE): its token clamped into the step (rows past it are masked).
fn q_read(r: u32, d: u32, t0: u32, kvh: u32) -> vec4<f32> {
    let t = min(t0 + r / GH, S.n_tokens - 1u);
    return Q[(t * H + kvh * GH + r % GH) * (HD / 4u) + d] * SCALE;
}

// The cache slot of key k0 + jj, from s0 = k0 % CTX: keys a tile reads lie within CTX of its first, so
// one subtraction wraps them (no integer division a load).
fn slot(s0: u32, jj: u32) -> u32 {
    let t = s0 + jj;
    return select(t, t - CTX, t >= CTX);
}

// Key k0 + jj's vec4 d, zeros past the last key any row sees (jn = hi - k0).
fn k_read(kvh: u32, s0: u32, jj: u32, jn: u32, d: u32) -> vec4<f32> {
    return select(vec4<f32>(0.0), KC[(kvh * CTX + slot(s0, min(jj, jn))) * (HD / 4u) + d], jj <= jn);
}

// Key k0 + jj's values, vec4 e (threads past the head read its last vec4 and write nothing).
fn v_read(kvh: u32, s0: u32, jj: u32, e: u32) -> vec4<f32> {
    return VC[(kvh * CTX + slot(s0, jj)) * (HD / 4u) + min(e, HD / 4u - 1u)];
}

// The tile row of P V accumulator 4a + i: row i of quad QG g + a.
fn pv_row(g: u32, a: u32, i: u32) -> u32 { return QG * g + a + 8u * i; }

// acc[4a + i] += p[pv_row(g, a, i)] v: this thread's rows times its vec4 of key j's values.
fn pv(acc: ptr<function, array<vec4<f32>, 16>>, j: u32, g: u32, v: vec4<f32>) {
    for (var a = 0u; a < QG; a++) {
        let p = kp[j * (RT / 4u) + QG * g + a];
        (*acc)[4u * a] = fma(vec4<f32>(p.x), v, (*acc)[4u * a]);
        (*acc)[4u * a + 1u] = fma(vec4<f32>(p.y), v, (*acc)[4u * a + 1u]);
        (*acc)[4u * a + 2u] = fma(vec4<f32>(p.z), v, (*acc)[4u * a + 2u]);
        (*acc)[4u * a + 3u] = fma(vec4<f32>(p.w), v, (*acc)[4u * a + 3u]);
    }
}

// Row r of the tile's rows: output vec4 e = acc / the row's sum (threads past the head write nothing).
fn write_row(r: u32, e: u32, acc: vec4<f32>, t0: u32, kvh: u32) {
    let t = t0 + r / GH;
    if (t < S.n_tokens && e < HD / 4u) { O[(t * H + kvh * GH + r % GH) * (HD / 4u) + e] = acc / row_a[r]; }
}

@compute @workgroup_size(NT)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let hd4 = HD / 4u;
    let kvh = wid.x;
    let t0 = wid.y * (RT / GH);
    if (t0 >= S.n_tokens) { return; }               // the plan is sized for its longest step
    let keys = key_range(t0, RT);
    let lo = keys.x;                                // the first key any row sees
    let hi = keys.y;                                // the last

    let rb = (lid % 32u) / 8u + 4u * ((lid / 32u) % 2u);    // scores: rows rb + 8i, keys kb + 32j
    let kb = lid % 8u + 8u * (lid / 64u);
    let lr = lid / DC;                              // chunk loads: Q row lr, keys lr + KROWS p, vec4 lc
    let lc = lid % DC;
    let g = lid / PT;                               // P V: quads QG g .., dims of vec4 e
    let e = lid % PT;
    var m: array<f32, 4>;                           // running max and sum of rows rb + 8i
    var l: array<f32, 4>;
    for (var i = 0u; i < 4u; i++) {
        m[i] = NEG;
        l[i] = 0.0;
    }
    var acc: array<vec4<f32>, 16>;                  // indexed by constants only (registers)
    for (var k0 = lo; k0 <= hi; k0 += BK) {
        let s0 = k0 % CTX;                          // the tile's first cache slot
        let jn = hi - k0;                           // its last key any row sees
        // scores: s[4i + j] of row rb + 8i against key kb + 32j
        var s: array<f32, 16>;
        s = array<f32, 16>();                       // zeroed by a statement: a declaration's zero may be hoisted out of the loop
        var qv = q_read(lr, lc, t0, kvh);
        var kv: array<vec4<f32>, KP>;
        for (var p = 0u; p < KP; p++) { kv[p] = k_read(kvh, s0, lr + KROWS * p, jn, lc); }
        workgroupBarrier();                         // the last tile's P V done with the probabilities
        for (var d0 = 0u; d0 < hd4; d0 += DC) {
            qs[lc * (RT + 1u) + lr] = qv;
            for (var p = 0u; p < KP; p++) { kp[lc * (BK + 1u) + lr + KROWS * p] = kv[p]; }
            workgroupBarrier();
            let dn = min(d0 + DC, hd4 - DC) + lc;   // the next chunk's reads (the last chunk reads itself again)
            qv = q_read(lr, dn, t0, kvh);
            for (var p = 0u; p < KP; p++) { kv[p] = k_read(kvh, s0, lr + KROWS * p, jn, dn); }
            for (var c = 0u; c < DC; c++) {
                var qr: array<vec4<f32>, 4>;
                var kr: array<vec4<f32>, 4>;
                for (var i = 0u; i < 4u; i++) { qr[i] = qs[c * (RT + 1u) + rb + 8u * i]; }
                for (var j = 0u; j < 4u; j++) { kr[j] = kp[c * (BK + 1u) + kb + 32u * j]; }
                for (var i = 0u; i < 4u; i++) {
                    for (var j = 0u; j < 4u; j++) { s[4u * i + j] = dot4_add(qr[i], kr[j], s[4u * i + j]); }
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
            red[(rb + 8u * i) * 33u + kb] = mx;
        }
        workgroupBarrier();
        var a: array<f32, 4>;                       // each row's rescale of what it has accumulated
        var n: array<f32, 4>;                       // and its new max
        for (var i = 0u; i < 4u; i++) {
            var mx = m[i];
            for (var k = 0u; k < 32u; k++) { mx = max(mx, red[(rb + 8u * i) * 33u + k]); }
            n[i] = mx;
        }
        workgroupBarrier();                         // every max read before red takes the sums
        for (var i = 0u; i < 4u; i++) {
            let mx = n[i];
            // probabilities (0 where masked), in place of the scores, and their partial sums
            var sum = 0.0;
            for (var j = 0u; j < 4u; j++) {
                let sc = s[4u * i + j];
                s[4u * i + j] = select(0.0, exp(sc - mx), sc > 0.5 * NEG);
                sum += s[4u * i + j];
            }
            red[(rb + 8u * i) * 33u + kb] = sum;
            a[i] = exp(m[i] - mx);                  // 1 while both are NEG (nothing accumulated yet)
            m[i] = mx;
            if (kb == 0u) { row_a[rb + 8u * i] = a[i]; }
        }
        for (var j = 0u; j < 4u; j++) {               // key kb + 32j's quad rb: rows rb + 8i
            kp[(kb + 32u * j) * (RT / 4u) + rb] = vec4<f32>(s[j], s[4u + j], s[8u + j], s[12u + j]);
        }
        workgroupBarrier();
        for (var i = 0u; i < 4u; i++) {
            var sum = 0.0;
            for (var k = 0u; k < 32u; k++) { sum += red[(rb + 8u * i) * 33u + k]; }
            l[i] = l[i] * a[i] + sum;
        }
        // P V: rescale this thread's rows, then every key of the tile: key j + u's values are loaded into slot u
        // of the ring as key j + u - VF's leave it (keys past the tile's last read that one again: its
        // probabilities are 0 and its values finite)
        for (var a = 0u; a < QG; a++) {
            for (var i = 0u; i < 4u; i++) { acc[4u * a + i] *= row_a[pv_row(g, a, i)]; }
        }
        let kn = min(BK, hi + 1u - k0);             // keys of this tile any row sees
        var vr: array<vec4<f32>, VF>;
        for (var u = 0u; u < VF; u++) { vr[u] = v_read(kvh, s0, min(u, kn - 1u), e); }
        for (var j = 0u; j < kn; j += VF) {
            for (var u = 0u; u < VF; u++) {
                let v = vr[u];
                vr[u] = v_read(kvh, s0, min(j + VF + u, kn - 1u), e);
                pv(&acc, j + u, g, v);
            }
        }
        // (the next tile writes red and row_a only after its scores' barriers, kp after the barrier before them)
    }
    workgroupBarrier();                             // every thread done reading row_a's rescales
    if (kb == 0u) {
        for (var i = 0u; i < 4u; i++) { row_a[rb + 8u * i] = l[i]; }
    }
    workgroupBarrier();
    for (var a = 0u; a < QG; a++) {
        for (var i = 0u; i < 4u; i++) { write_row(pv_row(g, a, i), e, acc[4u * a + i], t0, kvh); }
    }
}
