// A decode expert kernel's workgroup (moe_q4k.wgsl, moe_x8.wgsl): slot wid.y (token slot / KSEL, its
// (slot % KSEL)-th expert IDS[slot]), rows wid.x * (WG / TPR) .. of that expert, TPR threads a row; x,
// read through xv(), is X row slot / KSEL (XPER 1: the token's input) or slot (XPER KSEL). W holds
// experts E0 .. E0 + NE - 1: a slot routed elsewhere is not here. The including kernel declares X,
// IDS and the overrides.

var<private> x_row0: u32;                 // the first vec4 of this workgroup's input row

fn xv(i: u32) -> vec4<f32> { return X[x_row0 + i]; }

struct ExpertRow {
    row: u32,       // of the expert's N
    t: u32,         // this thread's place in the row's TPR
    e: u32,         // the expert
    here: bool,     // whether W holds it
}

// This thread's row of slot `slot` (after the kernel's check that the slot is in the step); points
// xv() at the slot's input row.
fn expert_row(slot: u32, wid: vec3<u32>, lid: u32) -> ExpertRow {
    x_row0 = select(slot / KSEL, slot, XPER > 1u) * (K / 4u);
    let e = IDS[slot];
    return ExpertRow(wid.x * (WG / TPR) + lid / TPR, lid % TPR, e, e >= E0 && e < E0 + NE);
}
