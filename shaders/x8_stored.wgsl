// x arriving rounded to int8 by the matvec that wrote it (matvec_out_q8.wgsl; quantize_q8.wgsl's
// layout), for a decode matvec on int8 x: the int8 kernels read the codes and (d, sum) pairs through
// x8q() and x8d() straight from storage (every row reads all of x: L1 serves them), nothing to round
// (x8_round.wgsl rounds x in each workgroup instead); xv() reads x back as d q, the f32 readers' view of
// the same x. It stands for both the input (matvec_input.wgsl) and x8_round.wgsl.

@group(0) @binding(15) var<storage, read> XQS: array<vec4<u32>>;   // [K / 16]
@group(0) @binding(16) var<storage, read> XSS: array<vec2<f32>>;   // [K / 32]

fn x8q(i: u32) -> vec4<u32> { return XQS[i]; }
fn x8d(b: u32) -> vec2<f32> { return XSS[b]; }

fn xv(i: u32) -> vec4<f32> { return vec4<f32>(unpack4xI8(XQS[i / 4u][i % 4u])) * XSS[i / 8u].x; }

fn input_prologue(lid: u32, first: bool) {}

fn x_prepare(lid: u32) {}
