// Gemma 4's audio features on the GPU: a clip's 16 kHz samples in, one row of 128 log-mel values per
// 10 ms frame out, as pyapp/families/gemma4_audio/features.py computes them in Python (its docstring
// states the rules; tests/kernels/test_log_mel.py holds them equal):
//   frame f: samples 160 f - 160 .. 160 f + 159 (the first 160 before the clip are zeros), times the
//   periodic Hann window of 320, zero-padded to 512; |X[k]| of its real DFT for k in 0..256; the 128
//   triangular mel filters over those magnitudes; log(mel + FLOOR).
// The DFT is direct (320 terms a bin, 257 bins a frame: ~0.25 GFLOP for 30 s), its cos/sin from a table
// of the 512 roots (TW: (cos, sin) of 2 pi j / 512, computed in float64 and rounded once: the built-in
// sin/cos are 1.9e-4 off on SwiftShader), the window (WIN [320]) and the filters (FB [128, 257], dense)
// from features.py's own tables. One workgroup a frame; S.n_tokens: the clip's frames, S.pos0: its samples.
// Dispatch: (frames) workgroups, split into (x, y) above 65535.

override FLOOR: f32 = 1e-3;
const FRAME: u32 = 320u;
const HOP: u32 = 160u;
const FFT: u32 = 512u;
const BINS: u32 = 257u;
const MELS: u32 = 128u;

@group(0) @binding(0) var<uniform> S: Step;
@group(0) @binding(1) var<storage, read> SAMP: array<f32>;
@group(0) @binding(2) var<storage, read> TW: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read> WIN: array<f32>;
@group(0) @binding(4) var<storage, read> FB: array<f32>;
@group(0) @binding(5) var<storage, read_write> MEL: array<f32>;

var<workgroup> xs: array<f32, FRAME>;    // the windowed frame
var<workgroup> mag: array<f32, BINS>;    // |X[k]|

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let f = wid.x + wid.y * nwg.x;
    if (f >= S.n_tokens) { return; }            // the plan is sized for 30 s
    for (var i = lid; i < FRAME; i += 128u) {
        let s = f * HOP + i;                     // index into the clip with HOP zeros before it
        xs[i] = select(0.0, SAMP[min(s - HOP, S.pos0 - 1u)], s >= HOP && s - HOP < S.pos0) * WIN[i];
    }
    workgroupBarrier();
    for (var k = lid; k < BINS; k += 128u) {
        // 8 partial sums (samples i = 8j + c): shorter chains round less (and overlap)
        var re = array<f32, 8>();
        var im = array<f32, 8>();
        for (var i = 0u; i < FRAME; i += 8u) {
            for (var c = 0u; c < 8u; c++) {
                let w = TW[(k * (i + c)) & (FFT - 1u)];
                re[c] = fma(xs[i + c], w.x, re[c]);
                im[c] = fma(xs[i + c], w.y, im[c]);
            }
        }
        let r = ((re[0] + re[1]) + (re[2] + re[3])) + ((re[4] + re[5]) + (re[6] + re[7]));
        let q = ((im[0] + im[1]) + (im[2] + im[3])) + ((im[4] + im[5]) + (im[6] + im[7]));
        mag[k] = sqrt(r * r + q * q);
    }
    workgroupBarrier();
    var total = 0.0;
    for (var k = 0u; k < BINS; k++) { total = fma(FB[lid * BINS + k], mag[k], total); }
    MEL[f * MELS + lid] = log(total + FLOOR);
}
