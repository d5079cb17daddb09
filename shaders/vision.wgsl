// Gemma 4's image encoder: the ops the text model's kernels do not cover.
//
// Mirrors pyapp/reference/vision.py (VisionEncoder). The image is G.across x G.down patches of
// P x P pixels, patch t = py * G.across + px at (px, py), row by row, G.n = across * down (G: Grid,
// the encoder's uniform; the other kernels of the encoder take the Step uniform, n_tokens = G.n).
//   patchify:  X[t, k] = 2 * (pixel / 255 - 0.5) of the RGBA8 image PX (G.across * P pixels a row),
//              or pixel / 255 unless SIGNED (the 12B's patch projection takes [0, 1]),
//              k in the patch embedding's order: (c, y, x) when CHANNEL_FIRST (a conv weight
//              [n, 3, P, P]), else (y, x, c). Thread per value; dispatch ceil(G.n * 3P^2 / 64).
//   positions: X[t] += TBL[px] + TBL[NPOS + py]: the learned 2-D position table [2, NPOS, D] (any
//              kernel type: quants' dq4). Thread per 4 floats; dispatch ceil(G.n * D / 256).
//   rope_2d:   X [G.n, H, HD] in place: a head's first half rotated by px, its second by py, each
//              half as NeoX pairs (i, i + HD / 4) at angle pos * THETA^(-4i / HD). Thread per pair.
//   pool:      O[s] = mean of the POOL x POOL patches of square s (row by row over the squares) *
//              SCALE [then (O - SB) * SS]. Thread per float of O; dispatch ceil(n_squares * D / 64).

override D: u32 = 4u;
override P: u32 = 16u;
override CHANNEL_FIRST: bool = true;
override SIGNED: bool = true;
override NPOS: u32 = 1u;
override H: u32 = 1u;
override HD: u32 = 4u;
override THETA: f32 = 100.0;
override POOL: u32 = 3u;
override SCALE: f32 = 1.0;
override HAS_STD: bool = false;

struct Grid { n: u32, across: u32, down: u32, pad: u32 }

@group(0) @binding(0) var<uniform> G: Grid;
@group(0) @binding(1) var<storage, read_write> X: array<f32>;
@group(0) @binding(2) var<storage, read> PX: array<u32>;
@group(0) @binding(3) var<storage, read> W: array<u32>;
@group(0) @binding(5) var<storage, read> A: array<f32>;
@group(0) @binding(6) var<storage, read_write> O: array<f32>;
@group(0) @binding(7) var<storage, read> SB: array<f32>;
@group(0) @binding(8) var<storage, read> SS: array<f32>;

//!include quants
//!include sincos

//!include thread_index

@compute @workgroup_size(64)
fn patchify(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    let k = 3u * P * P;
    if (i >= G.n * k) { return; }
    let t = i / k;
    let e = i % k;
    var c: u32;
    var y: u32;
    var x: u32;
    if (CHANNEL_FIRST) {
        c = e / (P * P);
        y = e % (P * P) / P;
        x = e % P;
    } else {
        c = e % 3u;
        y = e / 3u / P;
        x = e / 3u % P;
    }
    let px = (t % G.across) * P + x;
    let py = (t / G.across) * P + y;
    let rgba = PX[py * G.across * P + px];
    let byte = (rgba >> (8u * c)) & 0xffu;
    let unit = f32(byte) / 255.0;
    X[i] = select(unit, 2.0 * (unit - 0.5), SIGNED);
}

@compute @workgroup_size(64)
fn positions(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    let gpr = D / 4u;
    if (i >= G.n * gpr) { return; }
    let t = i / gpr;
    let g = i % gpr;
    let gpb = QK / 4u;
    let col = (g / gpb) * QB;
    let xs = dq4((t % G.across) * (D / QK) * QB + col, g % gpb);
    let ys = dq4((NPOS + t / G.across) * (D / QK) * QB + col, g % gpb);
    let o = 4u * i;
    X[o] += xs.x + ys.x;
    X[o + 1u] += xs.y + ys.y;
    X[o + 2u] += xs.z + ys.z;
    X[o + 3u] += xs.w + ys.w;
}

@compute @workgroup_size(64)
fn rope_2d(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    let quarter = HD / 4u;
    if (i >= G.n * H * 2u * quarter) { return; }
    let j = i % quarter;                    // the pair (j, j + quarter) of one half
    let axis = i / quarter % 2u;            // 0: the first half, by px; 1: the second, by py
    let row = i / (2u * quarter);           // (t, head)
    let t = row / H;
    let pos = select(t % G.across, t / G.across, axis == 1u);
    let angle = f32(pos) * pow(THETA, -f32(4u * j) / f32(HD));
    let sc = sin_cos(angle);                // not the built-ins: SwiftShader's are 1.9e-4 off (sincos.wgsl)
    let s = sc.x;
    let c = sc.y;
    let base = row * HD + axis * (HD / 2u) + j;
    let a = X[base];
    let b = X[base + quarter];
    X[base] = a * c - b * s;
    X[base + quarter] = b * c + a * s;
}

@compute @workgroup_size(64)
fn pool(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    let columns = G.across / POOL;
    let squares = columns * (G.down / POOL);
    if (i >= squares * D) { return; }
    let s = i / D;
    let d = i % D;
    let x0 = (s % columns) * POOL;
    let y0 = (s / columns) * POOL;
    var sum = 0.0;
    for (var y = 0u; y < POOL; y++) {
        for (var x = 0u; x < POOL; x++) {
            sum += A[((y0 + y) * G.across + x0 + x) * D + d];
        }
    }
    var v = sum / f32(POOL * POOL) * SCALE;
    if (HAS_STD) { v = (v - SB[d]) * SS[d]; }
    O[i] = v;
}
