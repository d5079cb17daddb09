// Decode expert matvec for the 32-weight block types (Q4_0, Q5_0, Q8_0: b32_codes.wgsl) on x rounded
// to int8, as llama.cpp's MMVQ does with q8_1: same contract as moe.wgsl experts
// (Y[s, n] = W[IDS[s], n] . x for slots s = t*KSEL + j, x = X row t (XPER 1) or s (XPER KSEL); W holds
// experts E0 .. E0 + NE - 1, slots routed elsewhere are not written; GEGLU: W is [E, 2N, K], each expert's
// gate rows then its up rows, Y[s, n] = gelu(gate_n . x) * (up_n . x)). Each workgroup rounds its slot's
// x into workgroup memory (x8_round.wgsl),
// then thread t of a row takes blocks t, t + TPR, ...: a block's 32 codes meet x's in 8 dot4I8Packed,
// w . x = a d_x sum(q_w q_x) - b sum(x) with the block's exact sum of x. The 26B-A4B's expert down
// projection (704-long rows: Q5_0 or Q8_0 in llama.cpp's Q4_K_M files) and, in its Q4_0 / Q8_0 files,
// the experts' gate|up too. Dispatch (ceil(N / (WG / TPR)), T * KSEL).

// (declared before the include: naga 29 panics on overrides declared after a workgroup array sized by
// an earlier one)
override KSEL: u32 = 1u;
override K: u32 = 32u;
override N: u32 = 1u;
override XPER: u32 = 1u;
override E0: u32 = 0u;
override NE: u32 = 1u;
override TPR: u32 = 2u;       // threads per row, power of two, <= WG
override WG: u32 = 128u;
override GEGLU: bool = false;

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> S: Step;
@group(0) @binding(4) var<storage, read> IDS: array<u32>;

//!include quants
//!include b32_codes
//!include gelu

var<workgroup> red: array<f32, WG>;
var<workgroup> red2: array<f32, WG>;      // GEGLU: the up rows' partial sums

//!include x8_round
//!include dot16_i8

//!include moe_slot

// Block b of the row whose first block starts at byte rb . x.
fn block_dot(rb: u32, b: u32) -> f32 {
    let c = b32_codes(rb + b * QB);
    let xl = x8q(2u * b);
    let xh = x8q(2u * b + 1u);
    let s = dot16_i8(c.lo, xl) + dot16_i8(c.hi, xh);
    let x = x8d(b);
    return c.ab.x * x.x * f32(s) - c.ab.y * x.y;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let slot = wid.y;
    if (slot >= S.n_tokens * KSEL) { return; }        // uniform per workgroup
    let r = expert_row(slot, wid, lid);
    x_prepare(lid);
    var acc = vec2<f32>(0.0);            // (row . x, GEGLU: its up row . x)
    if (r.here) {
        let rows_per_expert = select(N, 2u * N, GEGLU);
        let rb = ((r.e - E0) * rows_per_expert + min(r.row, N - 1u)) * XB * QB;
        let ub = rb + N * XB * QB;       // GEGLU: the matching up row
        // two blocks a round: their loads in flight together
        var b = r.t;
        for (; b + TPR < XB; b += 2u * TPR) {
            acc.x += block_dot(rb, b) + block_dot(rb, b + TPR);
            if (GEGLU) { acc.y += block_dot(ub, b) + block_dot(ub, b + TPR); }
        }
        if (b < XB) {
            acc.x += block_dot(rb, b);
            if (GEGLU) { acc.y += block_dot(ub, b); }
        }
    }
    red[lid] = acc.x;
    if (GEGLU) { red2[lid] = acc.y; }
    workgroupBarrier();
    for (var s = TPR / 2u; s > 0u; s >>= 1u) {
        if (r.t < s) {
            red[lid] += red[lid + s];
            if (GEGLU) { red2[lid] += red2[lid + s]; }
        }
        workgroupBarrier();
    }
    if (r.t == 0u && r.row < N && r.here) {
        Y[slot * N + r.row] = select(red[lid], gelu_tanh(red[lid]) * red2[lid], GEGLU);
    }
}
