"""What this GPU and backend reach at most: int8 dot products (dot4I8Packed, DP4A) and f32 multiply-adds
from WGSL, with no memory traffic: the ceilings to read the prefill kernels' TOPS / TFLOP/s against.

    python bench/peak_probe.py                   native (wgpu-native)
    node bench/node_bench.mjs --peak             the browser path (Pyodide + Dawn)

Each thread runs CHAINS independent accumulators through ITERS dependent steps (acc = dot4I8Packed(acc's
bytes, b) + acc; acc = fma(acc, b, c)), so the compiler can neither hoist nor fold them and the GPU has
CHAINS x the resident threads' work in flight. A DP4A counts 8 operations (4 multiply-adds), an FMA 2.
Prints one JSON line per probe: microseconds a dispatch (wall clock over repeated submits, as
bench/matmul_sweep.py) and tera-operations a second. Standard library only, so it runs in Pyodide.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

CHAINS = 32           # scalar accumulators a thread (CHAINS / 4 vec4s)
WORKGROUP = 256

_DP4A = """
@group(0) @binding(0) var<storage, read_write> Y: array<vec4<i32>>;
override ITERS: u32;
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let b = 0x01fe03fdu ^ g.x;
    var acc: array<vec4<i32>, CH>;
    for (var c = 0u; c < CH; c++) { acc[c] = vec4<i32>(i32(g.x + c), i32(c), i32(g.x), 7); }
    for (var i = 0u; i < ITERS; i++) {
        for (var c = 0u; c < CH; c++) {
            let a = bitcast<vec4<u32>>(acc[c]);
            acc[c] += vec4<i32>(dot4I8Packed(a.x, b), dot4I8Packed(a.y, b), dot4I8Packed(a.z, b), dot4I8Packed(a.w, b));
        }
    }
    var s = vec4<i32>(0);
    for (var c = 0u; c < CH; c++) { s += acc[c]; }
    Y[g.x] = s;
}
"""

_FMA = """
@group(0) @binding(0) var<storage, read_write> Y: array<vec4<f32>>;
override ITERS: u32;
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let b = 0.999 + f32(g.x % 7u) * 1e-6;
    var acc: array<vec4<f32>, CH>;
    for (var c = 0u; c < CH; c++) { acc[c] = vec4<f32>(f32(c), f32(g.x % 13u), 0.5, 0.25); }
    for (var i = 0u; i < ITERS; i++) {
        for (var c = 0u; c < CH; c++) { acc[c] = fma(acc[c], vec4<f32>(b), vec4<f32>(1e-3)); }
    }
    var s = vec4<f32>(0.0);
    for (var c = 0u; c < CH; c++) { s += acc[c]; }
    Y[g.x] = s;
}
"""

# (name, source, operations per accumulator lane a step)
PROBES = [("dot4I8Packed (int8 DP4A)", _DP4A, 8), ("fma f32", _FMA, 2)]


async def probe_async(dev, iters: int = 2048, workgroups: int = 132 * 16, repeat: int = 10) -> list[dict]:
    from matmul_sweep import _seconds_per_dispatch as seconds_per_dispatch
    threads = workgroups * WORKGROUP
    y = dev.buffer(16 * threads)
    rows = []
    for name, body, ops in PROBES:
        src = body.replace("WG", str(WORKGROUP)).replace("CH", str(CHAINS // 4))    # vec4 accumulators
        p = dev.pipeline_from_source(src, f"peak {name}", constants={"ITERS": iters})
        bg = dev.bind_group(p, {"Y": y})
        s = await seconds_per_dispatch(dev, dev.plan().dispatch(p, bg, workgroups), y, repeat, 1)
        total = threads * iters * CHAINS * ops
        rows.append({"probe": name, "us": round(s * 1e6, 1), "tera_ops_s": round(total / s / 1e12, 1),
                     "threads": threads, "iters": iters, "chains": CHAINS, "adapter": dev.describe()})
    return rows


def main():
    import asyncio
    from pyapp.gpu import get_device
    dev = get_device("native")
    for r in asyncio.run(probe_async(dev)):
        print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
