// sin and cos of an f32 angle to about 1 ulp, for RoPE (included by rope, norm and attention).
//
// WGSL's built-in sin/cos only promise an absolute error of 2^-11 on [-pi, pi] (nothing outside).
// lavapipe is exact to f32, but SwiftShader (Chromium's CPU WebGPU) is off by up to 1.9e-4
// everywhere: RoPE'd queries and keys then differ from transformers' (which takes an exact sin/cos
// of the same f32 angle) by ~5e-4, and the error grows through the layers. So we reduce and
// evaluate ourselves, in plain f32 arithmetic that every backend computes the same way:
//   k = round(a * 2/pi), r = a - k * pi/2 with pi/2 split in three parts (the first two short, so
//   that k * part is exact for |a| < ~6400), |r| <= pi/4;
//   sin r, cos r by minimax polynomials on [-pi/4, pi/4] (Cephes' single-precision coefficients);
//   the quadrant k mod 4 picks and signs them.
// Mirrors np.sin / np.cos of the f32 angle (reference.forward.rope_neox): within 1e-7 for |a| < 6400,
// 1e-6 up to 1e5 (where the f32 angle itself is only good to 4e-3).

const PIO2_1: f32 = 1.5703125;                     // pi/2 = PIO2_1 + PIO2_2 + PIO2_3
const PIO2_2: f32 = 4.837512969970703125e-4;
const PIO2_3: f32 = 7.549789954891882e-8;
const TWO_OVER_PI: f32 = 0.6366197723675814;

// (sin a, cos a)
fn sin_cos(a: f32) -> vec2<f32> {
    let k = round(a * TWO_OVER_PI);
    let r = ((a - k * PIO2_1) - k * PIO2_2) - k * PIO2_3;
    let z = r * r;
    let s = r + r * z * (-1.6666654611e-1 + z * (8.3321608736e-3 + z * -1.9515295891e-4));
    let c = 1.0 - 0.5 * z + z * z * (4.166664568298827e-2 + z * (-1.388731625493765e-3 + z * 2.443315711809948e-5));
    switch (i32(k) & 3) {
        case 0: { return vec2<f32>(s, c); }
        case 1: { return vec2<f32>(c, -s); }
        case 2: { return vec2<f32>(-s, -c); }
        default: { return vec2<f32>(-c, s); }
    }
}
