// A MoE layer's output for token t (reference layer: post_ffw_norm_1(mlp) + post_ffw_norm_2(moe)),
// one workgroup of TWG per token:
//   Y[t] = rms_norm(DN[t]) * W1 + rms_norm(C[t]) * W2,  C[t] = sum_j WTS[t, j] * YE[t*KSEL + j] [* SC[IDS[..]]]
// (moe.wgsl combine's sum, kept in registers). One dispatch instead of combine's and two norms'.
// One workgroup reads the whole of a token's KSEL expert rows (90 KB for the 26B-A4B): every thread
// issues all its loads (vec4s lid, lid + TWG, ... of the dense row, W1, W2 and each expert row) before
// any arithmetic, so they are in flight together rather than one round trip per element.
// D % 4 == 0, D <= 4 TWG TR, KSEL <= TKMAX (pyapp.gpu.kernels.moe_tail checks). Dispatch (T).

override KSEL: u32 = 1u;
override D: u32 = 4u;
override HAS_SC: bool = false;
override TEPS: f32 = 1e-6;
const TWG: u32 = MOE_TAIL_WORKGROUP;     // from the prelude (pyapp.gpu.kernels, which checks D against them)
const TKMAX: u32 = 16u;
const TR: u32 = MOE_TAIL_ROUNDS;         // vec4s a thread holds of each row

@group(0) @binding(0) var<storage, read_write> Y: array<vec4<f32>>;
@group(0) @binding(1) var<uniform> S: Step;
@group(0) @binding(2) var<storage, read> IDS: array<u32>;
@group(0) @binding(3) var<storage, read> WTS: array<f32>;
@group(0) @binding(4) var<storage, read> YE: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> SC: array<f32>;
@group(0) @binding(6) var<storage, read> DN: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read> W1: array<vec4<f32>>;
@group(0) @binding(8) var<storage, read> W2: array<vec4<f32>>;

var<workgroup> tail_red: array<vec2<f32>, TWG>;

@compute @workgroup_size(TWG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let t = wid.x + wid.y * nwg.x;
    if (t >= S.n_tokens) { return; }          // uniform per workgroup
    let n4 = D / 4u;
    let rounds = (n4 + TWG - 1u) / TWG;
    var wj: array<f32, TKMAX>;                // each chosen expert's weight (and down scale)
    for (var j = 0u; j < KSEL; j++) {
        let s = t * KSEL + j;
        var w = WTS[s];
        if (HAS_SC) { w *= SC[IDS[s]]; }
        wj[j] = w;
    }
    var dn: array<vec4<f32>, TR>;
    var c: array<vec4<f32>, TR>;
    var w1: array<vec4<f32>, TR>;
    var w2: array<vec4<f32>, TR>;
    for (var r = 0u; r < TR; r++) {
        let i = lid + r * TWG;
        dn[r] = vec4<f32>(0.0);
        c[r] = vec4<f32>(0.0);
        if (r < rounds && i < n4) {
            dn[r] = DN[t * n4 + i];
            w1[r] = W1[i];
            w2[r] = W2[i];
        }
    }
    for (var j = 0u; j < KSEL; j++) {
        let row = (t * KSEL + j) * n4;
        for (var r = 0u; r < TR; r++) {
            let i = lid + r * TWG;
            if (r < rounds && i < n4) { c[r] += wj[j] * YE[row + i]; }
        }
    }
    var ss = vec2<f32>(0.0);                  // sums of squares: the dense row, the combined experts
    for (var r = 0u; r < TR; r++) { ss += vec2<f32>(dot(dn[r], dn[r]), dot(c[r], c[r])); }
    tail_red[lid] = ss;
    workgroupBarrier();
    for (var s = TWG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) { tail_red[lid] += tail_red[lid + s]; }
        workgroupBarrier();
    }
    let inv = inverseSqrt(tail_red[0] / f32(D) + TEPS);
    for (var r = 0u; r < TR; r++) {
        let i = lid + r * TWG;
        if (r < rounds && i < n4) { Y[t * n4 + i] = dn[r] * inv.x * w1[r] + c[r] * inv.y * w2[r]; }
    }
}
