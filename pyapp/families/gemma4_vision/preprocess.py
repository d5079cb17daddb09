"""Gemma 4's image preprocessing, standard library only (it runs in Pyodide as well as CPython).

What transformers' Gemma4ImageProcessor does to an image before the encoder sees it (issue 28),
so that our soft tokens are the ones the model was trained on:

1. the size: the largest one that keeps the aspect ratio, has sides that are multiples of
   patch * pool (16 * 3 = 48 px) and at most budget * pool^2 patches (the soft-token budget is one
   of 70, 140, 280, 560, 1120; default 280); a side that would round to 0 becomes 48 px and the
   other follows the aspect ratio, capped at budget * 48 px (`target_size`);
2. the resize: PIL's BICUBIC (a = -0.5, the filter widened by the scale when shrinking), on the
   uint8 RGB image, by transformers' PIL backend (its torchvision backend, used when torchvision is
   installed, is bicubic with antialias: another implementation, pixels a level or so apart)
   (`resize`: Pillow when importable, else `resize_bicubic`, the same arithmetic in pure Python,
   equal to Pillow 13's bytes); an image already at its size is not resampled;
3. the pixels: divided by 255 (rescale_factor 1/255, no mean/std: the model's patch embedding maps
   [0, 1] to [-1, 1] itself);
4. the patches: 16 x 16, row-major over the image, each flattened as pixel (y, x) then channel
   (R, G, B), with its (x, y) patch coordinates (`patchify`); soft tokens = patches / pool^2. The 12B's
   processor (Gemma4UnifiedImageProcessor: the same size, the same pixels / 255) merges each 3 x 3 of
   them into one 48 x 48 patch, laid out the same way: `patchify(..., 48)`, a soft token each.

The page decodes and resizes with the browser (createImageBitmap, OffscreenCanvas), whose filter is
not PIL's: its pixels are close to, not equal to, the CLI's.
"""

from __future__ import annotations

import math
import struct
import sys
from array import array
from dataclasses import dataclass

from .config import BUDGETS, DEFAULT_BUDGET, VisionError

PATCH, POOL = 16, 3                      # patch_size, pooling_kernel_size of every Gemma 4 image processor

# Pillow's fixed-point resampling of 8-bit images (libImaging/Resample.c): coefficients scaled by 2^22
_BITS = 32 - 8 - 2
_HALF = 1 << (_BITS - 1)
_CLIP = [0] * 640 + list(range(256)) + [255] * (2048 - 896)      # clip8, indexed by (sum >> 22) + 640
_BICUBIC_A = -0.5
# float32(v * (1/255)) for each byte, as transformers' rescale computes it (float64 product, then float32):
# byte j of each value's float32, as a bytes.translate table (four C passes instead of a loop per pixel)
_SCALED = [bytes(struct.pack("=f", v * (1 / 255))[j] for v in range(256)) for j in range(4)]


class ImageError(VisionError):
    """An image, its size or its soft-token budget that cannot be turned into soft tokens."""


@dataclass
class Prepared:
    """An image as the encoder takes it: its size after resizing, the soft tokens it makes, its
    patches ([n, patch * patch * 3] float32 in [0, 1], flattened) and their (x, y) coordinates."""
    width: int
    height: int
    tokens: int
    patches: array
    positions: list
    rgb: bytes                           # the resized image, uint8 RGB, row-major


def check_budget(budget) -> int:
    """The soft-token budget as an int, if it is one the model was trained with."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget not in BUDGETS:
        raise ImageError(f"image token budget {budget!r} is not one of {', '.join(map(str, BUDGETS))}",
                         hint="the processor's max_soft_tokens takes only these")
    return budget


def _side(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ImageError(f"image {what} {value!r} is not a positive whole number of pixels")
    return value


def target_size(width: int, height: int, budget: int = DEFAULT_BUDGET, patch: int = PATCH,
                pool: int = POOL) -> tuple[int, int]:
    """(width, height) an image of that size is resized to: transformers'
    get_aspect_ratio_preserving_size, its float arithmetic in the same order (the floors decide)."""
    width, height = _side(width, "width"), _side(height, "height")
    budget = check_budget(budget)
    max_patches = budget * pool * pool
    target_px = max_patches * patch * patch
    factor = math.sqrt(target_px / (height * width))
    side = pool * patch
    th = int(math.floor(factor * height / side)) * side     # not //: float floor division rounds otherwise
    tw = int(math.floor(factor * width / side)) * side
    if th == 0 and tw == 0:                             # cannot happen for budget >= 1: kept as the processor has it
        raise ImageError(f"a {width}x{height} image would be resized to 0x0")
    longest = (max_patches // (pool * pool)) * side
    if th == 0:                                         # a very wide image: one band of patches
        th, tw = side, min(int(math.floor(width / height)) * side, longest)
    elif tw == 0:                                       # a very tall one
        tw, th = side, min(int(math.floor(height / width)) * side, longest)
    if th * tw > target_px:
        raise ImageError(f"resizing {width}x{height} to {tw}x{th} exceeds {max_patches} patches")
    return tw, th


def soft_tokens(width: int, height: int, patch: int = PATCH, pool: int = POOL) -> int:
    """The soft tokens an image of that (already resized) size makes: one per pool x pool patches."""
    side = patch * pool
    if _side(width, "width") % side or _side(height, "height") % side:
        raise ImageError(f"a {width}x{height} image is not a whole number of {side}-pixel squares: "
                         "resize it to target_size first")
    return (width // patch) * (height // patch) // (pool * pool)


def to_rgba(rgb, width: int, height: int) -> bytearray:
    """RGB bytes as RGBA8 (alpha 255): what the GPU encoder reads, as the page's canvas gives it."""
    view = _check_rgb(rgb, width, height)
    out = bytearray(b"\xff") * (width * height * 4)
    for c in range(3):
        out[c::4] = view[c::3]
    return out


def positions(width: int, height: int, patch: int = PATCH) -> list[tuple[int, int]]:
    """The (x, y) patch coordinates, row by row: the processor's image_position_ids."""
    return [(x, y) for y in range(height // patch) for x in range(width // patch)]


def _check_rgb(rgb, width: int, height: int, patch: int | None = None) -> memoryview:
    view = memoryview(rgb).cast("B") if not isinstance(rgb, memoryview) or rgb.format != "B" else rgb
    if view.nbytes != width * height * 3:
        raise ImageError(f"{view.nbytes} bytes of pixels for a {width}x{height} RGB image "
                         f"({width * height * 3} expected)")
    if patch is not None and (width % patch or height % patch):
        raise ImageError(f"a {width}x{height} image is not a whole number of {patch}-pixel patches")
    return view


def patch_bytes(rgb, width: int, height: int, patch: int = PATCH) -> bytearray:
    """The image's bytes reordered into patches (each patch row by row, pixel (y, x) then channel):
    what `patchify` scales to [0, 1], for a caller that uploads bytes and scales on the GPU."""
    view = _check_rgb(rgb, width, height, patch)
    row, seg = width * 3, patch * 3
    out = bytearray(width * height * 3)
    i = 0
    for py in range(0, height, patch):
        for px in range(0, width * 3, seg):
            start = py * row + px
            for r in range(patch):
                s = start + r * row
                out[i:i + seg] = view[s:s + seg]
                i += seg
    return out


def patchify(rgb, width: int, height: int, patch: int = PATCH) -> tuple[array, list[tuple[int, int]]]:
    """(patches, positions) of an image already at its target size: patches flattened
    [n, patch * patch * 3] float32 in [0, 1] (the processor's pixel_values, without its padding),
    positions their (x, y) (its image_position_ids): what the oracle's VisionEncoder.encode takes (gemma4_vision/reference.py)."""
    data = patch_bytes(rgb, width, height, patch)
    raw = bytearray(4 * len(data))
    for j, table in enumerate(_SCALED):
        raw[j::4] = data.translate(table)
    out = array("f")
    out.frombytes(raw)
    return out, positions(width, height, patch)


def _bicubic(x: float) -> float:
    if x < 0.0:
        x = -x
    if x < 1.0:
        return ((_BICUBIC_A + 2.0) * x - (_BICUBIC_A + 3.0)) * x * x + 1
    if x < 2.0:
        return (((x - 5) * x + 8) * x - 4) * _BICUBIC_A
    return 0.0


def _coefficients(in_size: int, out_size: int) -> list[tuple[int, list[int]]]:
    """Per output pixel: the first input pixel it reads and its fixed-point weights (Resample.c's
    precompute_coeffs and normalize_coeffs_8bpc: the weights summed in order, not by math.fsum or
    Python 3.12's compensated sum, so the roundings are Pillow's)."""
    scale = in_size / out_size
    filterscale = scale if scale > 1.0 else 1.0
    support = 2.0 * filterscale                        # bicubic's support is 2
    ss = 1.0 / filterscale
    out = []
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)
        n = min(int(center + support + 0.5), in_size) - xmin
        weights = [_bicubic((x + xmin - center + 0.5) * ss) for x in range(n)]
        total = 0.0
        for w in weights:
            total += w
        if total != 0.0:
            weights = [w / total for w in weights]
        fixed = [int(w * (1 << _BITS) + 0.5) if w >= 0 else int(w * (1 << _BITS) - 0.5) for w in weights]
        out.append((xmin, fixed))
    return out


def _resample_lines(lines: list, coeffs) -> list[bytes]:
    """Output line i = clip8(sum_t k[t] * lines[start + t]), element by element, for (start, k) in coeffs.

    The arithmetic is Pillow's (int32 sums of byte x fixed-point weight, plus half, >> 22, clipped),
    done on whole lines at once: a line is packed into one Python int with a 48-bit field per element,
    so a weighted sum of lines is a few big-int multiplies and adds (C loops, not a Python loop per
    pixel). Each field's sum plus a bias of 640 << 22 lies in [0, 2^33): no field borrows from or
    carries into its neighbour, and after the shift its low 16 bits are clip8's index (+ 640)."""
    n = len(lines[0])
    bias = ((640 << _BITS) + _HALF) * int.from_bytes(b"\x01\0\0\0\0\0" * n, "little")
    packed: dict[int, int] = {}
    out = []
    for start, k in coeffs:
        for old in [i for i in packed if i < start]:         # the windows only move forward
            del packed[old]
        acc = bias
        for t, w in enumerate(k):
            if w:
                p = packed.get(start + t)
                if p is None:
                    spread = bytearray(6 * n)
                    spread[::6] = lines[start + t]
                    p = packed[start + t] = int.from_bytes(spread, "little")
                acc += w * p
        fields = array("H", (acc >> _BITS).to_bytes(6 * n, "little"))
        if sys.byteorder == "big":
            fields.byteswap()
        out.append(bytes(map(_CLIP.__getitem__, fields[::3])))
    return out


def _horizontal(img: bytes, width: int, height: int, new_width: int) -> bytes:
    """Each output column of each channel from the source columns its taps cover."""
    row, new_row = width * 3, new_width * 3
    coeffs = _coefficients(width, new_width)
    out = bytearray(new_row * height)
    for c in range(3):
        columns = [img[3 * x + c::row] for x in range(width)]
        for xx, column in enumerate(_resample_lines(columns, coeffs)):
            out[3 * xx + c::new_row] = column
    return bytes(out)


def _vertical(img: bytes, width: int, height: int, new_height: int) -> bytes:
    """Each output row from the source rows its taps cover."""
    row = width * 3
    rows = [img[y * row:(y + 1) * row] for y in range(height)]
    return b"".join(_resample_lines(rows, _coefficients(height, new_height)))


def resize_bicubic(rgb, width: int, height: int, new_width: int, new_height: int,
                   horizontal_first: bool = False) -> bytes:
    """PIL's Image.resize(..., BICUBIC) of a uint8 RGB image, in pure Python: two passes (only those
    whose side changes), each rounded to bytes. Their order is Pillow 13's: the vertical pass first
    when the height shrinks by more than twice the pixels the width does, else the horizontal one
    (Pillow 12 and older always went horizontal first, as horizontal_first=True does: up to a few
    levels apart on such images, and transformers' pixels follow the Pillow installed).
    Seconds for a photo: the fallback when Pillow is not importable, and the spec of the pixels."""
    view = _check_rgb(rgb, width, height)
    _side(new_width, "width"), _side(new_height, "height")
    img = bytes(view)
    if not horizontal_first and height - new_height > 0 and height - new_height > (width - new_width) * 2:
        if new_height != height:
            img = _vertical(img, width, height, new_height)
        if new_width != width:
            img = _horizontal(img, width, new_height, new_width)
        return img
    if new_width != width:
        img = _horizontal(img, width, height, new_width)
    if new_height != height:
        img = _vertical(img, new_width, height, new_height)
    return img


def _pillow():
    try:
        from PIL import Image, ImageOps
    except ImportError:
        return None
    return Image, ImageOps


def resize(rgb, width: int, height: int, new_width: int, new_height: int) -> bytes:
    """The image at (new_width, new_height), as transformers resizes it: Pillow's BICUBIC when Pillow is
    importable, else resize_bicubic (the same bytes, slower); unchanged when the size is the same."""
    view = _check_rgb(rgb, width, height)
    if (new_width, new_height) == (width, height):
        return bytes(view)
    pil = _pillow()
    if pil is None:
        return resize_bicubic(view, width, height, new_width, new_height)
    image = pil[0].frombytes("RGB", (width, height), bytes(view))
    return image.resize((new_width, new_height), pil[0].Resampling.BICUBIC).tobytes()


def decode(data: bytes) -> tuple[bytes, int, int]:
    """(rgb, width, height) of an image file's bytes (PNG, JPEG, ... whatever Pillow reads), turned
    upright by its EXIF orientation and made RGB as transformers loads images: transparency is
    composited onto white (its convert_to_rgb). Needs Pillow (CPython: the CLI)."""
    pil = _pillow()
    if pil is None:
        raise ImageError("reading image files needs Pillow, which is not installed",
                         hint="pip install pillow (into this Python environment)")
    import io
    Image, ImageOps = pil
    try:
        image = Image.open(io.BytesIO(bytes(data)))
        image = ImageOps.exif_transpose(image)
        if "A" in image.getbands() or image.info.get("transparency") is not None:
            image = image.convert("RGBA")
            white = Image.new("RGBA", image.size, (255, 255, 255, 255))
            image = Image.alpha_composite(white, image)
        image = image.convert("RGB")
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        raise ImageError(f"not an image Pillow can read: {e}", detail=repr(e)) from None
    return image.tobytes(), image.width, image.height


def prepare(rgb, width: int, height: int, budget: int = DEFAULT_BUDGET, patch: int = PATCH,
            pool: int = POOL) -> Prepared:
    """A decoded uint8 RGB image as the encoder takes it (resized, scaled, cut into patches)."""
    _check_rgb(rgb, width, height)
    tw, th = target_size(width, height, budget, patch, pool)
    pixels = resize(rgb, width, height, tw, th)
    patches, where = patchify(pixels, tw, th, patch)
    return Prepared(tw, th, soft_tokens(tw, th, patch, pool), patches, where, pixels)
