// The decode matvec's input vector x (K floats as vec4), read from X: the plain case.
// pyapp.gpu.kernels.matvec puts this or matvec_input_residual.wgsl (x built from a pending
// residual add) in the prelude of matvec*.wgsl, which read x through xv() only.

fn xv(i: u32) -> vec4<f32> { return X[i]; }

fn input_prologue(lid: u32, first: bool) {}
