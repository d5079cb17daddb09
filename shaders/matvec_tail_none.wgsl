// A matvec dispatch with no extra workgroup (matvec_tail_route.wgsl has one).

fn tail_workgroup(wg: u32, lid: u32) -> bool { return false; }
