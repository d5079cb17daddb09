"""The 12B's golden images (tools/make_unified_vision_fixtures.py: tests/fixtures/forms/mmproj-12b*.vision.npz):
their pixels regenerated from the seeds the golden names, and cut into the 48-px patches the oracle takes."""

from __future__ import annotations

import random

import numpy as np

from .paths import FIXTURES

FORMS = FIXTURES / "forms"
PROJECTORS = ("mmproj-12b", "mmproj-12b-bf16")     # llama.cpp's projector files of the 12B: F16, BF16
PATCH = 48
BEGIN, SOFT, END = 6, 7, 8                         # the fixtures' <|image>, <|image|>, <image|>


def golden(stem: str):
    return np.load(FORMS / f"{stem}.vision.npz")


def case_image(gold, i: int) -> tuple[bytes, int, int]:
    """Case i's uint8 RGB pixels (at the size the processor keeps) and that size."""
    width, height = (int(v) for v in gold[f"case_{i}"][:2])
    return random.Random(100 + i).randbytes(width * height * 3), width, height


def small_image(gold, j: int) -> tuple[bytes, int, int]:
    """The two-image prompt's image j."""
    across, down = (int(v) for v in gold[f"small_{j}"])
    width, height = across * PATCH, down * PATCH
    return random.Random(200 + j).randbytes(width * height * 3), width, height


def patches_of(rgb: bytes, width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    """(patches [n, 48 * 48 * 3] float32 in [0, 1], pixel (y, x) then channel; their (x, y)): the processor's
    pixel_values and image_position_ids, by pyapp's preprocessing."""
    from pyapp.families.gemma4_vision.preprocess import patchify
    patches, positions = patchify(rgb, width, height, PATCH)
    return np.frombuffer(patches, np.float32).reshape(len(positions), -1), np.array(positions, np.int64)
