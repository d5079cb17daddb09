"""The prefill matmul: Y = X W^T for a chunk of tokens, in shared-memory tiles (shaders/matmul*.wgsl).

Two paths: W dequantized into f32 (or f16) tiles (MatmulTile, any kernel type), and for the int8 weight
types, X rounded to int8 per 32 and multiplied by W's int8 codes as they stand (quantize_q8 + matmul_q8,
as llama.cpp's MMQ). The tile shapes come from bench/matmul_sweep.py; MoE's grouped experts use the same
tiles (moe.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ... import ggml
from .. import Buffer, Device, Plan
from .quants import q8_b32_prelude, quant_prelude, quant_type, row_bytes
from .shared import groups, pipeline, thread_groups


@dataclass(frozen=True)
class MatmulTile:
    """Shape of the prefill matmul's tile (shaders/matmul_tile.wgsl): W rows x tokens per workgroup,
    weights of K per shared-memory step, and tokens per thread (4 or 8; each thread has 4 rows);
    f16: the shared tiles in f16, f16_math: their multiply-adds too (both need shader-f16)."""
    rows: int = 64
    tokens: int = 64
    k: int = 32
    thread_tokens: int = 4
    f16: bool = False
    f16_math: bool = False

    def __post_init__(self):
        units = self.k // 4 * max(self.rows, self.tokens) // 4       # a step's load units of W or X
        if self.rows % 4 or self.tokens % self.thread_tokens or self.thread_tokens not in (4, 8) \
                or self.k % 4 or units > self.threads or self.threads > 1024 \
                or self.f16_math and not self.f16:     # f16 math on f16 tiles
            raise ValueError(f"bad matmul tile {self}")

    @property
    def threads(self) -> int:
        return self.rows // 4 * (self.tokens // self.thread_tokens)

    def fits(self, dev: Device) -> bool:
        """Within the device's workgroup limits (threads, and the shared W and X tiles plus the MoE
        kernel's slot list)."""
        vec4 = 8 if self.f16 else 16
        storage = vec4 * self.k * (self.rows // 4 + self.tokens // 4 + 2) + 4 * self.tokens + 4
        lim = dev.limits
        return self.threads <= min(lim.get("max_compute_invocations_per_workgroup", 256),
                                   lim.get("max_compute_workgroup_size_x", 256)) \
            and storage <= lim.get("max_compute_workgroup_storage_size", 16384) and (not self.f16 or dev.has_f16)

    def prelude(self) -> str:
        shape = "".join(f"const MM_{n}: u32 = {v}u;\n" for n, v in (
            ("BM", self.rows), ("BN", self.tokens), ("BK", self.k), ("TN", self.thread_tokens)))
        return shape + (f"alias MM_S = {'f16' if self.f16 else 'f32'};\nalias MM_M = {'f16' if self.f16_math else 'f32'};\n"
                        f"const MM_F16_MATH: bool = {'true' if self.f16_math else 'false'};\n")

    @property
    def enables(self) -> tuple:
        """The WGSL extensions its shader needs."""
        return ("f16",) if self.f16 else ()

    def half(self) -> "MatmulTile":
        """This tile with f16 shared tiles and multiply-adds (F16_TILES says which)."""
        return replace(self, f16=True, f16_math=F16_MATH)


# The engine's tiles (bench/matmul_sweep.py on an H100, bench/RESULTS.md). Grouped MoE tiles are
# narrower: a 512-token chunk gives an expert ~32 slots (8 of 128 experts a token).
# A device with fewer threads or less storage a workgroup gets the first FALLBACK tile that fits.
MATMUL = MatmulTile(64, 128, 32)
MATMUL_SHORT = MatmulTile(64, 64, 32)       # plans of at most 64 tokens: half the padding
# Where the engine's tile makes fewer workgroups than this (few rows of W: the PLE gate's 256), the smallest
# tile: E2B's F16 256 x 1536 at 512 tokens 49.9 us against 153.8 (16 workgroups for 132 SMs), E4B's
# 256 x 2560 78.4 against 220.8 (H100, browser path, bench/RESULTS.md 2026-11-27, seventh session)
MATMUL_FEW_ROWS = MatmulTile(32, 32, 32)
MATMUL_MIN_WORKGROUPS = 64
MOE_MATMUL = MatmulTile(128, 32, 32)
FALLBACK = (MatmulTile(64, 64, 32), MatmulTile(64, 64, 16), MatmulTile(32, 32, 16))


# The f16 tiles' multiply-adds: f16 too (True) or f32 on the f16 tiles (False); bench/matmul_sweep.py --f16
F16_MATH = True


def fit_tile(dev: Device, tile: MatmulTile, f16: bool = False) -> MatmulTile:
    """tile, or the first FALLBACK tile within dev's workgroup limits; f16: in its f16 form
    (MatmulTile.half, the same shape) where the device has shader-f16."""
    for t in (tile, *FALLBACK):
        if t.fits(dev):
            return t.half() if f16 and dev.has_f16 else t
    raise ValueError(f"no prefill matmul tile fits this device's workgroup limits ({dev.limits})")


def matmul_tile_for(rows: int, n_tokens: int) -> MatmulTile:
    """The f32 matmul's tile for rows of W and a step of n_tokens: the short one for few tokens, the smallest
    where the engine's would leave most of the GPU idle."""
    if n_tokens <= MATMUL_SHORT.tokens:
        return MATMUL_SHORT
    workgroups = -(-rows // MATMUL.rows) * -(-n_tokens // MATMUL.tokens)
    return MATMUL if workgroups >= MATMUL_MIN_WORKGROUPS else MATMUL_FEW_ROWS


def matmul_prelude(qtype, tile: MatmulTile) -> str:
    """quant_prelude plus the tile's shape."""
    return quant_prelude(qtype) + tile.prelude()


def matmul(dev: Device, qtype, k: int, n: int, w: Buffer, x: Buffer, y, params: Buffer,
           n_tokens: int, plan: Plan | None = None, ldy: int = 0, tile: MatmulTile | None = None,
           f16: bool = False, clamp=None, partials: Buffer | None = None, split: int | None = None,
           summed: bool = True) -> Plan:
    """Y[t, n] = X[t, k] @ W[n, k]^T; params: the per-step uniform (pack_step), t = its n_tokens.

    n_tokens sizes the dispatch: the most tokens this plan will see. ldy: row
    stride of Y when W is one row block of a wider matrix (y bound at its column).
    f16: the default tile's f16 form where the device has shader-f16.
    clamp: a buffer (range) of a clippable linear's 4 bounds (in_min, in_max, out_min, out_max):
    Y = clamp(clamp(X, in) @ W^T, out), in the same dispatch.
    partials: f32 room for the partial sums of slices of K (matmul_split_for; split forces a count), which a
    second dispatch adds into y (not with clamp); summed False: y is not written, the reader adds them
    (K.add_normed's x_slices; matmul_shape says how many there are).
    """
    row_bytes(qtype, k)
    room = partials.size // 4 if partials is not None else 0
    tile, split = matmul_shape(dev, n, k, n_tokens, room, tile, f16, clamp is not None, split)
    if split > 1 and (clamp is not None or k % (tile.k * split) or n % 4 or split * n_tokens * n > room):
        raise ValueError(f"no {split} slices of K = {k} for {n} rows x {n_tokens} tokens in {room} floats")
    p = pipeline(dev, "matmul", prelude=matmul_prelude(qtype, tile), enables=tile.enables,
                 constants={"CLAMP": clamp is not None})
    bg = dev.bind_group(p, {"W": w, "X": x, "Y": partials if split > 1 else y, "S": params,
                            "CB": clamp if clamp is not None else dev.dummy,
                            "D": dev.uniform_values(k, n, 0 if split > 1 else ldy, split)})
    plan = plan if plan is not None else dev.plan()
    plan.dispatch(p, bg, -(-n // tile.rows), -(-n_tokens // tile.tokens), split)
    if split > 1 and summed:
        sum_slices(dev, partials, y, params, n, split, ldy, n_tokens, plan)
    return plan


def matmul_shape(dev: Device, n: int, k: int, n_tokens: int, room: int, tile: MatmulTile | None = None,
                 f16: bool = False, clamped: bool = False, split: int | None = None) -> tuple[MatmulTile, int]:
    """The tile and slices of K that matmul takes for n rows x k at n_tokens (room: floats of partial sums),
    unless told: the caller can know whether the output is left in slices (matmul's summed)."""
    tile = tile or fit_tile(dev, matmul_tile_for(n, n_tokens), f16)
    if split is None:
        split = matmul_split_for(tile, n, k, n_tokens, room) if not clamped else 1
    return tile, split


# The f32 tile over slices of K where it makes few workgroups: the per-layer-input gate's 256 rows (F16 in our
# generator's files) make 128 of the 32 x 32 tile at 512 tokens, each 64 threads walking K = 1536 alone.
MATMUL_SPLIT_MIN_WORKGROUPS = 256
MATMUL_SLICE_MIN_K = 256
MATMUL_SPLIT_MAX = 4


def matmul_split_for(tile: MatmulTile, rows: int, k: int, n_tokens: int, room: int) -> int:
    """Slices of K for the f32 tile's matmul of rows x k at n_tokens (1: none), within room floats of partial
    sums: on the few-rows tile (the only one measured split: steps of at most 64 tokens keep theirs whole)
    where it makes fewer than MATMUL_SPLIT_MIN_WORKGROUPS, the most slices (up to MATMUL_SPLIT_MAX) whole
    in the tile's steps and at least MATMUL_SLICE_MIN_K long."""
    workgroups = -(-rows // tile.rows) * -(-n_tokens // tile.tokens)
    # the few-rows tile by its shape: fit_tile may give its f16 form
    if (tile.rows, tile.tokens) != (MATMUL_FEW_ROWS.rows, MATMUL_FEW_ROWS.tokens) or rows % 4 \
            or workgroups >= MATMUL_SPLIT_MIN_WORKGROUPS:
        return 1
    return most_slices(rows, k, n_tokens, room, tile.k, MATMUL_SPLIT_MAX, MATMUL_SLICE_MIN_K)


def most_slices(rows: int, k: int, n_tokens: int, room: int, step: int, most: int, min_k: int) -> int:
    """The most slices of K (up to `most`, 1: none) whole in `step`-weight steps, each at least min_k long,
    whose partial sums (slices x n_tokens x rows floats) fit room: both matmuls' rule once they split."""
    best = 1
    for split in range(2, most + 1):
        if k // split < min_k or split * n_tokens * rows > room:
            break
        if k % (step * split) == 0:
            best = split
    return best


def sum_slices(dev: Device, partials: Buffer, y: Buffer, params: Buffer, n: int, split: int, ldy: int,
               n_tokens: int, plan: Plan) -> None:
    """y[t, :n] = the sum of split slices' partial sums (partials f32 [split, t, n]; y rows ldy apart, 0: n)."""
    p = pipeline(dev, "sum_slices", constants={"N": n, "SPLIT": split, "LDY": ldy})
    plan.dispatch(p, dev.bind_group(p, {"P": partials, "Y": y, "S": params}), *thread_groups(n_tokens * n // 4))


# Steps sized for more tokens than this multiply INT8_TYPES weights by int8 activations (quantize_q8 +
# matmul_q8, as llama.cpp's MMQ); shorter ones, decode and training keep the f32 tile.
INT8_MIN_TOKENS = 64
Q8_BLOCK = 32             # activations per int8 scale


@dataclass(frozen=True)
class Q8Tile:
    """Shape of the int8 matmul's tile (shaders/matmul_q8_tile.wgsl): W rows x tokens per workgroup,
    rows and tokens per thread (4 or 8 each). A thread has one or two load jobs of W (2 a row) and at most
    one of X (4 a group of 4 tokens: there are never more tokens than threads)."""
    rows: int = 64
    tokens: int = 64
    thread_rows: int = 4
    thread_tokens: int = 4

    def __post_init__(self):
        if self.thread_rows not in (4, 8) or self.thread_tokens not in (4, 8) or self.rows % 64 \
                or self.tokens % 32 \
                or 2 * self.rows > 2 * self.threads:   # <= 2 W jobs a thread
            raise ValueError(f"bad int8 matmul tile {self}")

    @property
    def threads(self) -> int:
        return self.rows // self.thread_rows * self.tokens // self.thread_tokens

    @property
    def storage(self) -> int:
        """Bytes of workgroup storage: W's codes (16 a row and step) and scales (16 a row), X's codes and scales
        (16 + 4 a token), and the grouped MoE kernel's slot list (4 a token, 4)."""
        return 80 * (self.rows + self.tokens) + 4 * self.tokens + 4

    def prelude(self, qtype, k: int) -> str:
        """The tile's shape and the weight format's include for qtype."""
        return "".join(f"const MQ_{n}: u32 = {v}u;\n" for n, v in (
            ("BM", self.rows), ("BN", self.tokens), ("TM", self.thread_rows), ("TN", self.thread_tokens))) \
            + q8_weights_prelude(qtype, k)


# The tile by the workgroups a matmul makes (bench/matmul_sweep.py on the H100's browser path, 512 tokens,
# int8, quantization included, bench/RESULTS.md 2026-11-27): the 128 x 64 tile with 8 rows a thread runs best
# where it makes many workgroups (E4B's 20480-row gate|up: 1184 us against 1297 at 64 x 32); with a few waves
# of them or fewer, the GPU idles in the last wave and 64 x 32 (4x the workgroups) wins: E4B's 2560 x 10240
# down 788 against 1047 us (Q6_K 1112 against 1509), 256 x 2560 79 against 152, 1536 x 12288 622 against 699.
# (2048 rows, 128 workgroups at 128 x 64, one exact wave of the H100's 132 SMs, is the exception: 182 against
# 235.) Those figures are the 128 x 64 tile's with 4 tokens a thread (256 threads); the rule's thresholds were
# not swept again for the tile with eight:
# Eight tokens a thread (128 threads, two load jobs each; a third fewer shared-memory reads a DP4A): on an
# H200's browser path (twelfth session) E2B's 24576 x 1536 Q4_K gate|up 776 -> 751 us, its 1536 x 12288 down
# over 4 slices 565 -> 418 (Q4_0 687 -> 534); in the engine's 512-token chunk E2B Q4_K 53.7 -> 52.4 ms, E4B
# Q4_K_M 105.7 -> 102.4.
Q8_MATMUL = Q8Tile(128, 64, 8, 8)
Q8_SMALL = Q8Tile(64, 32)          # 128 threads
Q8_MATMUL_MIN_WORKGROUPS = 256


def q8_tile_for(rows: int, n_tokens: int) -> Q8Tile:
    """The int8 matmul's tile for rows of W and a step of n_tokens: the large one only where it fills the GPU."""
    big = Q8_MATMUL
    workgroups = rows // big.rows * -(-n_tokens // big.tokens)
    return big if rows % big.rows == 0 and workgroups >= Q8_MATMUL_MIN_WORKGROUPS else Q8_SMALL


# Few rows (the projections into the residual stream: E2B's 1536-row o and down): rather than the small
# tile, the large one over slices of K (matmul_q8.wgsl SPLIT, as MMQ's stream-k), as many as Q8_SPLIT_MAX
# of at least Q8_SLICE_MIN_K weights each, their partial sums added by sum_slices.wgsl. On an H100's browser
# path (bench/matmul_sweep.py, 512 tokens, the sum included, tenth session): 1536 x 12288 (Q4_K) 584.7 us on
# the small tile, 466.3 in 4 slices (2: 611.2, 3: 809.2); 1536 x 6144 835.6 -> 308.6; 2560 x 10240 732.9 ->
# 633.0; 1536 x 2048 108.0 -> 102.2. In the engine's 512-token chunk (GPU timestamps): E2B Q4_K 64.2 -> 59.9
# ms, E2B Q8_0 76.6 -> 67.0, E4B Q4_K 118.9 -> 111.1 (the sums 2.0-3.0 ms of it).
Q8_SLICE_MIN_K = 512
Q8_SPLIT_MAX = 4


def q8_slices(tile: Q8Tile, rows: int, k: int, n_tokens: int, room: int) -> int:
    """Slices of K for tile's int8 matmul of rows x k at n_tokens (1: none), within room floats of partial
    sums (the caller's buffer; 0: none): where the tile alone makes fewer than Q8_MATMUL_MIN_WORKGROUPS, the
    most slices (up to Q8_SPLIT_MAX) whole in 64-weight steps and at least Q8_SLICE_MIN_K long."""
    workgroups = rows // tile.rows * -(-n_tokens // tile.tokens)
    if rows % tile.rows or workgroups >= Q8_MATMUL_MIN_WORKGROUPS:
        return 1
    return most_slices(rows, k, n_tokens, room, 64, Q8_SPLIT_MAX, Q8_SLICE_MIN_K)


# Fewer rows still (the per-layer-input gate's 256: 16 workgroups of the large tile at 512 tokens, 48 over 3
# slices): where the large tile's slices make fewer than this, the small tile's (64 of it, 192 over 3).
Q8_SPLIT_MIN_WORKGROUPS = 128


def q8_tile_split(rows: int, k: int, n_tokens: int, room: int) -> tuple[Q8Tile, int]:
    """The int8 matmul's tile and slices of K for rows x k at n_tokens within room floats of partial sums: the
    large tile over slices (q8_slices) where they make Q8_SPLIT_MIN_WORKGROUPS or more, else q8_tile_for's
    tile, the small one over slices too."""
    big = Q8_MATMUL
    split = q8_slices(big, rows, k, n_tokens, room)
    if split > 1 and rows // big.rows * -(-n_tokens // big.tokens) * split >= Q8_SPLIT_MIN_WORKGROUPS:
        return big, split
    tile = q8_tile_for(rows, n_tokens)
    return tile, q8_slices(tile, rows, k, n_tokens, room) if tile == Q8_SMALL else 1


def fit_q8_tile(dev: Device, tile: Q8Tile) -> Q8Tile:
    """tile, or the small one where the device's workgroups cannot hold its threads or its storage."""
    limit = min(dev.limits.get("max_compute_invocations_per_workgroup", 256),
                dev.limits.get("max_compute_workgroup_size_x", 256))
    room = dev.limits.get("max_compute_workgroup_storage_size", 16384)
    return tile if tile.threads <= limit and tile.storage <= room else Q8_SMALL


# weight types whose codes are int8 as they stand (shaders/q8_weights_*.wgsl): K a multiple of this
INT8_TYPES = {ggml.Q4_K: 256, ggml.Q6_K: 256, ggml.Q4_0: 64, ggml.Q5_0: 64, ggml.Q8_0: 64}


def int8_matmul(qtype, k: int, n_tokens: int) -> bool:
    """Whether a matmul of this weight type, row length and plan size takes the int8 path."""
    align = INT8_TYPES.get(quant_type(qtype))
    return align is not None and k % align == 0 and n_tokens > INT8_MIN_TOKENS


def q8_weights_prelude(qtype, k: int) -> str:
    """The int8 tile's weight format (shaders/q8_weights_q4k.wgsl, q8_weights_q6k.wgsl or q8_weights_b32.wgsl)
    for qtype."""
    t = quant_type(qtype)
    if t not in INT8_TYPES or k % INT8_TYPES[t]:
        raise ValueError(f"no int8 matmul for {ggml.name(t)} rows of {k}")
    if t == ggml.Q4_K:
        return "//!include q8_weights_q4k\n"
    if t == ggml.Q6_K:
        return "//!include quants\n//!include q8_weights_q6k\n"
    return q8_b32_prelude(t) + "//!include quants\n//!include q8_weights_b32\n"


def q8_bytes(max_tokens: int, k: int) -> tuple[int, int]:
    """Bytes of quantize_q8's outputs for max_tokens rows of k: the int8 codes and the (d, sum) pairs."""
    return max_tokens * k, max_tokens * (k // Q8_BLOCK) * 8


def check_q8_rows(k: int) -> None:
    """Rows of k activations can be rounded to int8 (quantize_q8's layout: whole blocks of Q8_BLOCK)."""
    if k % Q8_BLOCK:
        raise ValueError(f"int8 activations need rows of a multiple of {Q8_BLOCK}, not {k}")


def quantize_q8(dev: Device, k: int, x: Buffer, xq: Buffer, xs: Buffer, params: Buffer, n_tokens: int,
                plan: Plan | None = None, rows_per_token: int = 1, geglu: bool = False, out=None) -> Plan:
    """XQ, XS = x's rows (f32 [t * rows_per_token, k], t = params' n_tokens) as int8 per 32 with
    (scale, sum) per block. geglu: x holds [gate | up] rows (f32 [rows, 2 k]) and the rows rounded are
    gelu(gate) * up (the GeGLU fused into the down projection's rounding), also written to out where given."""
    check_q8_rows(k)
    p = pipeline(dev, "quantize_q8", constants={"K": k, "RPT": rows_per_token, "GEGLU": geglu,
                                                "KEEP": out is not None})
    bg = dev.bind_group(p, {"X": x, "XQ": xq, "XS": xs, "S": params, "O": out if out is not None else dev.dummy_out})
    plan = plan if plan is not None else dev.plan()
    return plan.dispatch(p, bg, *groups(-(-n_tokens * rows_per_token * k // Q8_BLOCK // 8)))


def matmul_q8(dev: Device, qtype, k: int, n: int, w: Buffer, xq: Buffer, xs: Buffer, y, params: Buffer,
              n_tokens: int, plan: Plan | None = None, ldy: int = 0, tile: Q8Tile | None = None,
              partials: Buffer | None = None, split: int | None = None, summed: bool = True) -> Plan:
    """Y[t, n] = X[t, k] @ W[n, k]^T for W of an INT8_TYPES type, X as quantize_q8 left it (xq, xs).
    partials: f32 room for the partial sums of slices of K (q8_tile_split; split forces a count, on the large
    tile unless tile says otherwise), which a second dispatch adds into y; summed False: y is not written,
    the reader adds them (K.add_normed's x_slices; q8_shape says how many there are)."""
    room = partials.size // 4 if partials is not None else 0
    tile, split = q8_shape(dev, n, k, n_tokens, room, tile, split)
    if split > 1 and (k % (64 * split) or n % 4 or split * n_tokens * n > room):
        raise ValueError(f"no {split} slices of K = {k} for {n} rows x {n_tokens} tokens in {room} floats")
    p = pipeline(dev, "matmul_q8", prelude=tile.prelude(qtype, k))
    bg = dev.bind_group(p, {"W": w, "XQ": xq, "XS": xs, "Y": partials if split > 1 else y, "S": params,
                            "D": dev.uniform_values(k, n, 0 if split > 1 else ldy, split)})
    plan = plan if plan is not None else dev.plan()
    plan.dispatch(p, bg, -(-n // tile.rows), -(-n_tokens // tile.tokens), split)
    if split > 1 and summed:
        sum_slices(dev, partials, y, params, n, split, ldy, n_tokens, plan)
    return plan


def q8_shape(dev: Device, n: int, k: int, n_tokens: int, room: int, tile: Q8Tile | None = None,
             split: int | None = None) -> tuple[Q8Tile, int]:
    """The tile and slices of K that matmul_q8 takes for n rows x k at n_tokens (room: floats of partial
    sums), unless told (a forced count: the large tile over slices, else the rule's tile)."""
    if tile is None and split is None:
        tile, split = q8_tile_split(n, k, n_tokens, room)
        return fit_q8_tile(dev, tile), split
    if tile is None:
        return fit_q8_tile(dev, Q8_MATMUL if split > 1 else q8_tile_for(n, n_tokens)), split
    return tile, 1 if split is None else split
