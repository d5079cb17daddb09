// The decode matvec's input x built by every workgroup from the partial softmax states that
// attention_decode's split left for one token: the attention output attend_combine would write, so the
// projection reading it (the o projection) takes no combine dispatch of its own (pyapp.runtime.fusion
// combined_inputs; a decode step is bound by its dispatches). For head h and vec4 slot d of its output:
//   x[h, d] = sum_s e^(m_s - M_h) acc_s[d] / sum_s e^(m_s - M_h) l_s      M_h = max_s m_s
// over the splits s that held keys of the query at AS.pos0 (the others hold an earlier step's states).
// PART[h, s] = (m, l, 0, 0), acc[AHD / 4] as attend_split writes them. Mirrors attention_decode.wgsl
// attend_combine. x lives in workgroup memory (XS = K / 4 = AH * AHD / 4 vec4s); the including matvec
// declares K and WG and reads x through xv() after input_prologue().

override XS: u32 = 1u;
override AH: u32 = 1u;                // query heads
override AHD: u32 = 4u;               // floats a head
override ANSPLIT: u32 = 1u;           // splits a head's partials hold (attend_split's NSPLIT)
override AWINDOW: u32 = 0u;           // the attention's WINDOW and KEYS_BEFORE: which keys the query saw
override AKEYS_BEFORE: u32 = 0u;
override AHS: u32 = 1u;               // AH * ANSPLIT (an array's size takes one override: naga)

@group(0) @binding(4) var<storage, read> PART: array<vec4<f32>>;
@group(0) @binding(5) var<uniform> AS: Step;

var<workgroup> xs: array<vec4<f32>, XS>;
var<workgroup> aw: array<f32, AHS>;     // each split's m, then its weight e^(m_s - M_h) / L_h
var<workgroup> al: array<f32, AHS>;     // each split's l

fn xv(i: u32) -> vec4<f32> { return xs[i]; }

// The splits that held keys: as attend_combine's `used` (attention_decode.wgsl key_end, query_range).
fn used_splits() -> u32 {
    let end = AS.pos0 + 1u - AKEYS_BEFORE;
    var lo = 0u;
    if (AWINDOW > 0u && end > AWINDOW) { lo = end - AWINDOW; }
    return min(ANSPLIT, (end - lo + DECODE_KEYS_PER_GROUP - 1u) / DECODE_KEYS_PER_GROUP);
}

fn input_prologue(lid: u32, first: bool) {
    let used = used_splits();
    let hd4 = AHD / 4u;
    let stride = hd4 + 1u;                   // vec4s a partial: (m, l, 0, 0), acc
    for (var i = lid; i < AH * used; i += WG) {
        let at = (i / used) * ANSPLIT + i % used;
        let ml = PART[at * stride];
        aw[at] = ml.x;
        al[at] = ml.y;
    }
    workgroupBarrier();
    if (lid < AH) {                          // a head's weights: a few dozen splits at most (fusion's bound)
        let b = lid * ANSPLIT;
        var big = -3.0e38;
        for (var s = 0u; s < used; s++) { big = max(big, aw[b + s]); }
        var l = 0.0;
        for (var s = 0u; s < used; s++) {
            let e = exp(aw[b + s] - big);
            aw[b + s] = e;
            l += e * al[b + s];
        }
        for (var s = 0u; s < used; s++) { aw[b + s] /= l; }
    }
    workgroupBarrier();
    // each vec4 of x: its head's splits, four loads in flight
    for (var i = lid; i < XS; i += WG) {
        let p = (i / hd4) * ANSPLIT;
        let at = p * stride + 1u + i % hd4;
        var acc = vec4<f32>(0.0);
        var s = 0u;
        for (; s + 4u <= used; s += 4u) {
            let a0 = PART[at + s * stride];
            let a1 = PART[at + (s + 1u) * stride];
            let a2 = PART[at + (s + 2u) * stride];
            let a3 = PART[at + (s + 3u) * stride];
            acc += aw[p + s] * a0 + aw[p + s + 1u] * a1 + aw[p + s + 2u] * a2 + aw[p + s + 3u] * a3;
        }
        for (; s < used; s++) { acc += aw[p + s] * PART[at + s * stride]; }
        xs[i] = acc;
    }
    workgroupBarrier();
}
