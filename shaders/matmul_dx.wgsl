// Backward of a frozen projection Y = X W^T: dX[t, k] (+)= sum_n dY[t, COL0 + n] * W[n, k]   (dX = dY W)
//
// Mirrors pyapp.reference.backward.linear_backward. W is the projection's GGUF tensor [N, K] (rows of K,
// any type in quants.wgsl), dequantized in the kernel as the forward does and never copied to f32
// (QLoRA-style). dY: f32 rows of LDD floats (0: N), this projection's outputs from column COL0 (a fused
// q|k|v or gate|up output holds several; a W split into row blocks is one dispatch per block, the
// later ones with ACC). dX: f32 [T, K] (K a multiple of QK, so of 4); ACC adds into it (the residual
// and LoRA paths sum their dX). T = S.n_tokens (the per-step uniform).
// Tiles of TILE tokens x TILE outputs (k), 256 threads a workgroup: dx_tile.wgsl.
// Dispatch: (ceil(K / TILE), ceil(T / TILE)).

override K: u32;
override N: u32;
override LDD: u32 = 0u;
override COL0: u32 = 0u;
override ACC: bool = false;

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> DY: array<f32>;
@group(0) @binding(2) var<storage, read_write> DX: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> S: Step;

//!include quants
//!include dx_tile

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let T = S.n_tokens;
    let g0 = wid.x * 16u;            // the tile's first output group
    let t0 = wid.y * TILE;
    let yt = t0 + lid / 4u;          // the token whose dY row this thread loads
    let acc = dx_tile(lid, g0, 0u, yt, yt < T, 1.0);
    let kg = K / 4u;
    let g = g0 + lid % 16u;
    if (g < kg) {
        for (var j = 0u; j < 4u; j++) {
            let t = t0 + lid / 16u + 16u * j;
            if (t < T) {
                let i = t * kg + g;
                if (ACC) { DX[i] = DX[i] + acc[j]; } else { DX[i] = acc[j]; }
            }
        }
    }
}
