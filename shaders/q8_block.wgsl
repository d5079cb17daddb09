// The int8 rounding of activations, one block of 32 (llama.cpp's quantize_q8_1; pyapp.reference.
// quants.quantize_activations_q8): d = max |x| / 127, q = round(x / d) in -127..127 (0 where the block
// is all zero), and the block's exact sum of x (for the weights' min terms). One rule for the prefill's
// quantize_q8.wgsl, the decode kernels' x8_round.wgsl and matvec_out_q8.wgsl (q8_scale, q8_word: a block
// rounded by 8 threads), so every path rounds alike.

struct Q8Block {
    q: array<u32, 8>,     // the codes four to a word, byte i of word w = element 4 w + i (dot4I8Packed's order)
    ds: vec2<f32>,        // (d, sum of x)
}

// (d, 1 / d) of a block whose largest magnitude is amax (1 / d = 0 for an all-zero block).
fn q8_scale(amax: f32) -> vec2<f32> {
    let d = amax / 127.0;
    return vec2<f32>(d, select(0.0, 1.0 / d, d > 0.0));
}

// Four of a block's values as codes (dot4I8Packed's byte order), given its q8_scale's 1 / d.
fn q8_word(v: vec4<f32>, inv: f32) -> u32 { return pack4xI8(vec4<i32>(round(v * inv))); }

fn q8_block(v: array<vec4<f32>, 8>) -> Q8Block {
    var amax = 0.0;
    var sum = 0.0;
    for (var i = 0u; i < 8u; i++) {
        let a = abs(v[i]);
        amax = max(amax, max(max(a.x, a.y), max(a.z, a.w)));
        sum += v[i].x + v[i].y + v[i].z + v[i].w;
    }
    let s = q8_scale(amax);
    var out: Q8Block;
    for (var i = 0u; i < 8u; i++) { out.q[i] = q8_word(v[i], s.y); }
    out.ds = vec2<f32>(s.x, sum);
    return out;
}
