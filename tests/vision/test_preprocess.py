"""Image preprocessing (pyapp.families.gemma4_vision.preprocess) against transformers'
Gemma4ImageProcessor: the golden file tools/make_preprocess_golden.py wrote with its PIL backend
(sizes for every budget over random and extreme images; the pixels of ten images, bit for bit), and,
where transformers and Pillow are importable, the processor itself."""

from __future__ import annotations

import hashlib
import random
from array import array

import numpy as np
import pytest

from pyapp.families.gemma4_vision import preprocess as pp
from support.paths import FIXTURES

GOLDEN = FIXTURES / "vision" / "preprocess.golden.npz"


@pytest.fixture(scope="module")
def golden():
    return np.load(GOLDEN)


def _cases(golden):
    return sorted(int(k.split("_")[1]) for k in golden.files if k.startswith("case_"))


def test_target_sizes_match_transformers(golden):
    rows = golden["sizes"]
    assert len(rows) == 2325 and set(rows[:, 2]) == set(pp.BUDGETS)
    for w, h, budget, tw, th in rows.tolist():
        got = pp.target_size(w, h, budget)
        assert got == (tw, th), (w, h, budget)
        assert tw % 48 == 0 and th % 48 == 0 and pp.soft_tokens(tw, th) <= budget
    # the extremes, spelled out: a 1 x 2000 strip is one band of patches as long as the budget allows
    assert pp.target_size(1, 2000, 280) == (48, 13440) and pp.soft_tokens(48, 13440) == 280
    assert pp.target_size(2000, 1, 70) == (3360, 48)
    assert pp.target_size(10, 10) == (768, 768) and pp.soft_tokens(768, 768) == 256
    assert pp.target_size(4032, 3024) == (912, 672) and pp.soft_tokens(912, 672) == 266


def test_pixels_and_positions_match_transformers(golden, monkeypatch):
    """Each case through prepare() with the pure-Python resize (Pillow hidden): the processor's
    pixel_values (bytes / 255, float32) and image_position_ids, bit for bit."""
    monkeypatch.setattr(pp, "_pillow", lambda: None)
    for i in _cases(golden):
        w, h, budget, tokens, tw, th = golden[f"case_{i}"].tolist()
        data = random.Random(i).randbytes(w * h * 3)
        assert hashlib.sha256(data).hexdigest() == str(golden[f"source_sha_{i}"]), "random.randbytes changed"
        p = pp.prepare(data, w, h, budget)
        assert (p.width, p.height, p.tokens) == (tw, th, tokens)
        assert len(p.positions) + int(golden[f"padding_{i}"]) == budget * 9
        ordered = pp.patch_bytes(p.rgb, tw, th)
        head = np.frombuffer(ordered, np.uint8)[:2 * 768].reshape(2, 768)
        assert np.array_equal(head, golden[f"head_{i}"]), f"case {i}: first patches differ"
        assert hashlib.sha256(ordered).hexdigest() == str(golden[f"pixels_sha_{i}"]), f"case {i}"
        patches = np.frombuffer(p.patches, np.float32).reshape(len(p.positions), 768)
        want = (np.frombuffer(ordered, np.uint8).reshape(-1, 768) * (1 / 255)).astype(np.float32)
        assert np.array_equal(patches, want)
        assert patches.min() >= 0.0 and patches.max() <= 1.0
        assert np.array_equal(np.array(p.positions), golden[f"positions_{i}"])


def test_patch_order_is_the_encoders():
    """patchify's layout is the one gemma4_vision/reference.py and tools/make_vision_golden.py use: patches row by
    row, each pixel (y, x) then channel; positions (x, y)."""
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (96, 144, 3), dtype=np.uint8)                   # 6 rows of 9 patches
    patches, where = pp.patchify(img.tobytes(), 144, 96)
    got = np.frombuffer(patches, np.float32).reshape(-1, 16, 16, 3)
    assert got.shape[0] == 54 and where[:10] == [(x, 0) for x in range(9)] + [(0, 1)]
    for k, (x, y) in enumerate(where):
        assert np.array_equal(got[k] * 255, img[16 * y:16 * y + 16, 16 * x:16 * x + 16].astype(np.float32))
    assert isinstance(patches, array) and patches.typecode == "f"
    rgba = np.frombuffer(pp.to_rgba(img.tobytes(), 144, 96), np.uint8).reshape(96, 144, 4)
    assert np.array_equal(rgba[..., :3], img) and (rgba[..., 3] == 255).all()


def test_bad_input_is_refused():
    with pytest.raises(pp.ImageError, match="budget 300"):
        pp.target_size(10, 10, 300)
    with pytest.raises(pp.ImageError, match="width 0"):
        pp.target_size(0, 10)
    with pytest.raises(pp.ImageError, match="48-pixel"):
        pp.soft_tokens(50, 48)
    with pytest.raises(pp.ImageError, match="bytes of pixels"):
        pp.patchify(b"\0" * 10, 16, 16)
    with pytest.raises(pp.ImageError, match="16-pixel patches"):
        pp.patchify(b"\0" * (20 * 16 * 3), 20, 16)
    from pyapp.errors import Gemma4Error
    from pyapp.families.gemma4_vision.config import VisionError
    assert issubclass(pp.ImageError, VisionError) and issubclass(pp.ImageError, Gemma4Error)


def test_resize_equals_pillow():
    """resize_bicubic is Pillow's BICUBIC to the byte, growing, shrinking, one side or both, the two
    passes in the order of the Pillow installed (13 goes vertical first when the height shrinks more)."""
    PIL = pytest.importorskip("PIL")
    from PIL import Image
    legacy = int(PIL.__version__.split(".")[0]) < 13
    rng = np.random.default_rng(3)
    for w, h, tw, th in ((10, 10, 96, 48), (300, 200, 144, 96), (37, 53, 48, 96), (5, 400, 48, 96), (64, 64, 64, 32),
                         (400, 900, 240, 576), (1, 1, 48, 48), (7, 300, 48, 2592)):
        img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        want = Image.fromarray(img).resize((tw, th), Image.Resampling.BICUBIC).tobytes()
        assert pp.resize_bicubic(img.tobytes(), w, h, tw, th, horizontal_first=legacy) == want
        assert pp.resize(img.tobytes(), w, h, tw, th) == want
    a, b = (pp.resize_bicubic(img.tobytes(), 400, 900, 240, 576, horizontal_first=f)
            for img in [rng.integers(0, 256, (900, 400, 3), dtype=np.uint8)] for f in (False, True))
    assert a != b                     # the order matters: the golden (Pillow 13's) pins it


@pytest.mark.slow
def test_live_processor():
    """The processor itself (transformers' PIL backend), where transformers and Pillow are installed."""
    pytest.importorskip("PIL")
    pytest.importorskip("transformers")
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil
    proc = Gemma4ImageProcessorPil()
    rng = np.random.default_rng(4)
    for w, h, budget in ((300, 200, 280), (5, 900, 140), (1, 1, 70), (640, 480, 1120)):
        img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        res = proc(images=[img], max_soft_tokens=budget, input_data_format="channels_last", return_tensors="np")
        p = pp.prepare(img.tobytes(), w, h, budget)
        n = len(p.positions)
        assert p.tokens == res["num_soft_tokens_per_image"][0] == n // 9
        assert np.array_equal(np.frombuffer(p.patches, np.float32).reshape(n, -1), res["pixel_values"][0][:n])
        assert np.array_equal(np.array(p.positions), res["image_position_ids"][0][:n])


def test_decode_composites_transparency_onto_white(tmp_path):
    """decode: RGBA transparency over white, as transformers' convert_to_rgb; EXIF orientation applied."""
    Image = pytest.importorskip("PIL.Image")
    import io
    im = Image.new("RGBA", (3, 2), (10, 20, 30, 0))
    im.putpixel((0, 0), (200, 100, 50, 255))
    buf = io.BytesIO()
    im.save(buf, "PNG")
    rgb, w, h = pp.decode(buf.getvalue())
    assert (w, h) == (3, 2) and rgb[:6] == bytes([200, 100, 50, 255, 255, 255])
    exif = Image.Exif()
    exif[0x0112] = 6                                          # rotate 90 degrees clockwise to view
    buf = io.BytesIO()
    Image.new("RGB", (4, 2), (1, 2, 3)).save(buf, "JPEG", exif=exif)
    assert pp.decode(buf.getvalue())[1:] == (2, 4)
    with pytest.raises(pp.ImageError, match="not an image"):
        pp.decode(b"not an image at all")


def test_decode_without_pillow_says_so(monkeypatch):
    monkeypatch.setattr(pp, "_pillow", lambda: None)
    with pytest.raises(pp.ImageError, match="needs Pillow") as e:
        pp.decode(b"\x89PNG")
    assert "pip install pillow" in e.value.hint
