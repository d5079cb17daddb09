// DiffusionGemma's sampler for one denoising step, on the canvas logits, so only small vectors reach the CPU.
//
// Mirrors reference.denoise.step_decisions and the loop around it (transformers' entropy-bound sampler and
// stable-and-confident stop). DP: the step's parameters (pyapp.gpu.kernels.pack_denoise_step), u32 words:
//   [0] temperature (f32 bits)  [1] forced: DRAW holds sampled ids, not uniforms  [2] entropy bound (f32)
//   [3] confidence threshold (f32)  [4] stability threshold  [5] first step of a block  [6] n: canvas tokens
//   [8 .. 8+C)      DRAW: per position a uniform in [0, 1) (f32 bits) or, forced, the sampled id
//   [8+C .. 8+2C)   NOISE: per position the renoise id
// L: f32 [n, V] the decoder's logits; `rows` divides them by the temperature in place (the processed
// logits, the next step's self-conditioning input).
//   rows:   one workgroup per canvas position t: proc = L / temp; AM[t] = argmax (first index);
//           ENT[t] = entropy of softmax(proc) = log S1 - S2 / S1 (S1 = sum e, S2 = sum e (proc - max),
//           e = exp(proc - max)); SMP[t] = the first id whose cumulative e exceeds u * S1 (each thread sums
//           a contiguous slice, thread 0 walks the slices, then the one slice), or DRAW[t] when forced.
//           Dispatch n (split above 65535).
//   accept: one workgroup. Rank the entropies (ties by position), cumulative sums in rank order;
//           accepted[t] = cum[rank t] - ENT[t] <= bound; IDS[t] (the next step's canvas) = accepted ?
//           SMP[t] : NOISE[t]. Stability: RUN counts the steps in a row, this block, whose argmax is the
//           same (PREV holds the last one); stable = threshold 0 or RUN > threshold. confident = mean(ENT)
//           < confidence threshold. OUT (u32): [0] stop = stable and confident, [1] accepted count,
//           [2] stable, [3] confident, [4] mean entropy (f32 bits), [8 .. 8+n) AM, [8+C .. 8+C+n) accepted.
//           Dispatch 1.
// C (override): the canvas length the buffers are sized for; n <= C.

override V: u32;
override C: u32;
override WG: u32 = 256u;

@group(0) @binding(0) var<storage, read_write> L: array<f32>;
@group(0) @binding(1) var<storage, read> DP: array<u32>;
@group(0) @binding(2) var<storage, read_write> ENT: array<f32>;
@group(0) @binding(3) var<storage, read_write> AM: array<u32>;
@group(0) @binding(4) var<storage, read_write> SMP: array<u32>;
@group(0) @binding(5) var<storage, read_write> IDS: array<u32>;
@group(0) @binding(6) var<storage, read_write> PREV: array<u32>;   // [0]: RUN, [1 .. 1+C): the last argmax
@group(0) @binding(7) var<storage, read_write> OUT: array<u32>;
@group(0) @binding(8) var<storage, read> ENTR: array<f32>;
@group(0) @binding(9) var<storage, read> AMR: array<u32>;
@group(0) @binding(10) var<storage, read> SMPR: array<u32>;

var<workgroup> rv: array<f32, WG>;
var<workgroup> ri: array<u32, WG>;
var<workgroup> part: array<f32, WG>;

fn reduce_sum(lid: u32) -> f32 {
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) { rv[lid] += rv[lid + s]; }
        workgroupBarrier();
    }
    let r = rv[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(WG)
fn rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let t = wid.x + wid.y * nwg.x;
    if (t >= DP[6]) { return; }                  // uniform per workgroup
    let temp = bitcast<f32>(DP[0]);
    let base = t * V;
    // pass 1: divide in place; max and its first index
    var best = -3.4e38;
    var bi = 0xffffffffu;
    for (var v = lid; v < V; v += WG) {
        let x = L[base + v] / temp;
        L[base + v] = x;
        if (x > best) { best = x; bi = v; }
    }
    rv[lid] = best;
    ri[lid] = bi;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            let ov = rv[lid + s];
            let oi = ri[lid + s];
            if (ov > rv[lid] || (ov == rv[lid] && oi < ri[lid])) { rv[lid] = ov; ri[lid] = oi; }
        }
        workgroupBarrier();
    }
    let m = rv[0];
    let am = select(ri[0], 0u, ri[0] == 0xffffffffu);
    workgroupBarrier();
    // pass 2: each thread a contiguous slice: its sum of e (for the sampling walk), and S1, S2
    let per = (V + WG - 1u) / WG;
    let lo = min(lid * per, V);
    let hi = min(lo + per, V);
    var s1 = 0.0;
    var s2 = 0.0;
    for (var v = lo; v < hi; v++) {
        let d = L[base + v] - m;
        let e = exp(d);
        s1 += e;
        s2 += e * d;
    }
    part[lid] = s1;
    rv[lid] = s1;
    let S1 = reduce_sum(lid);
    rv[lid] = s2;
    let S2 = reduce_sum(lid);
    if (lid == 0u) {
        ENT[t] = log(S1) - S2 / S1;
        AM[t] = am;
        if (DP[1] != 0u) {
            SMP[t] = DP[8u + t];
        } else {
            let goal = bitcast<f32>(DP[8u + t]) * S1;
            var acc = 0.0;
            var pick = am;               // if rounding leaves the walk short: the most likely id
            for (var j = 0u; j < WG; j++) {
                if (acc + part[j] > goal) {
                    let jlo = min(j * per, V);
                    let jhi = min(jlo + per, V);
                    for (var v = jlo; v < jhi; v++) {
                        acc += exp(L[base + v] - m);
                        if (acc > goal) { pick = v; break; }
                    }
                    break;
                }
                acc += part[j];
            }
            SMP[t] = pick;
        }
    }
}

var<workgroup> sorted_e: array<f32, C>;
var<workgroup> cum: array<f32, C>;
var<workgroup> rank: array<u32, C>;
var<workgroup> same: atomic<u32>;
var<workgroup> n_acc: atomic<u32>;

@compute @workgroup_size(WG)
fn accept(@builtin(local_invocation_index) lid: u32) {
    let n = DP[6];
    let bound = bitcast<f32>(DP[2]);
    let first = DP[5] != 0u;
    if (lid == 0u) { atomicStore(&same, 1u); atomicStore(&n_acc, 0u); }
    workgroupBarrier();
    for (var t = lid; t < n; t += WG) {
        let e = ENTR[t];
        var r = 0u;
        for (var j = 0u; j < n; j++) {
            let f = ENTR[j];
            if (f < e || (f == e && j < t)) { r++; }
        }
        rank[t] = r;
        sorted_e[r] = e;
        if (first || PREV[1u + t] != AMR[t]) { atomicStore(&same, 0u); }
    }
    workgroupBarrier();
    if (lid == 0u) {
        var c = 0.0;
        for (var r = 0u; r < n; r++) { c += sorted_e[r]; cum[r] = c; }
    }
    workgroupBarrier();
    for (var t = lid; t < n; t += WG) {
        let ok = cum[rank[t]] - ENTR[t] <= bound;
        IDS[t] = select(DP[8u + C + t], SMPR[t], ok);
        OUT[8u + t] = AMR[t];
        OUT[8u + C + t] = select(0u, 1u, ok);
        if (ok) { atomicAdd(&n_acc, 1u); }
        PREV[1u + t] = AMR[t];
    }
    workgroupBarrier();
    if (lid == 0u) {
        var run = 1u;
        if (atomicLoad(&same) != 0u) { run = PREV[0] + 1u; }
        PREV[0] = run;
        let stab = DP[4];
        let stable = stab == 0u || run > stab;
        var total = 0.0;
        for (var t = 0u; t < n; t++) { total += ENTR[t]; }
        let mean = total / f32(n);
        let confident = mean < bitcast<f32>(DP[3]);
        OUT[0] = select(0u, 1u, stable && confident);
        OUT[1] = atomicLoad(&n_acc);
        OUT[2] = select(0u, 1u, stable);
        OUT[3] = select(0u, 1u, confident);
        OUT[4] = bitcast<u32>(mean);
    }
}
