// A decode matvec's rows written to Y only: the plain case (matvec_out_q8.wgsl also rounds them to
// int8 for the next matvec). pyapp.gpu.kernels.matvec puts one of the two in the prelude.

// Row `row`'s value y, by the row's thread 0 (lid its local index).
fn store_row(row: u32, lid: u32, y: f32) { Y[row] = y; }

// After every row is stored, in uniform control flow (wg: the workgroup's index).
fn round_rows(wg: u32, lid: u32) {}
