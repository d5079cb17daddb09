// One workgroup more in a one-token matvec's dispatch: the one at index TAIL (the first after the
// matvec's own) routes the token instead (route_choice.wgsl), a dispatch fewer for a decode step
// (pyapp.runtime.ops: a MoE router's choice left pending rides on the next matvec that does not
// read it). matvec_tail_none.wgsl is the plain case.

override TAIL: u32 = 0u;

//!include route_choice

// Whether workgroup wg was the tail (then it has routed; the matvec returns).
fn tail_workgroup(wg: u32, lid: u32) -> bool {
    if (wg != TAIL) { return false; }
    route_token(0u, lid);
    return true;
}
