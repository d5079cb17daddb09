"""Gemma 4's image encoder on the GPU (pyapp.families.gemma4_vision.encoder) against transformers'
get_image_features (tools/make_vision_golden.py) and the numpy reference (pyapp/families/gemma4_vision/reference.py),
on the Ollama-form fixtures: clamp bounds per linear and packed (v.clamp_data), a wide and a tall
image, the pooled soft tokens in the text model's width. The 12B's patch projection
(pyapp.families.gemma4_vision.projection) likewise on llama.cpp's projector files of it
(tools/make_unified_vision_fixtures.py), and the 12B's logits with its images."""

from __future__ import annotations

import numpy as np
import pytest

from pyapp.families.gemma4_vision.preprocess import to_rgba
from pyapp.gguf import read_gguf
from pyapp.steps import drive
from pyapp.runtime.requests import handler

from support.paths import FIXTURES

pytestmark = pytest.mark.gpu
FORMS = FIXTURES / "forms"


def rgba_of(patches: np.ndarray, positions: np.ndarray, patch: int) -> tuple[bytes, int, int]:
    """The RGBA8 image whose patches (rows of patch * patch * 3 values in [0, 1], pixel (y, x) then
    channel) these are, and its size in patches."""
    across, down = int(positions[:, 0].max()) + 1, int(positions[:, 1].max()) + 1
    image = np.zeros((down * patch, across * patch, 4), np.uint8)
    for (x, y), row in zip(positions, patches):
        image[y * patch:(y + 1) * patch, x * patch:(x + 1) * patch, :3] = np.round(
            row.reshape(patch, patch, 3) * 255).astype(np.uint8)
    return image.tobytes(), across, down


def load(dev, path, budget=1):
    from pyapp.families.gemma4_vision.encoder import encoder_class
    g = read_gguf(path)
    return drive(encoder_class(g).load(dev, g, budget=budget), handler(dev, g.source))


def features(dev, enc, patches, positions) -> np.ndarray:
    pixels, across, down = rgba_of(patches, positions, enc.cfg.patch)
    out = enc.encode(pixels, across, down)
    n = across * down // enc.cfg.pool ** 2
    return np.frombuffer(dev.read(out, 0, 4 * n * enc.cfg.text_hidden), np.float32).reshape(n, -1)


@pytest.mark.parametrize("stem", ["ollama-dense", "ollama-dense-published", "ollama-moe", "ollama-moe-published"])
def test_soft_tokens_match_transformers(dev, stem):
    golden = np.load(FORMS / f"{stem.removesuffix('-published')}.vision.npz")
    enc = load(dev, FORMS / f"{stem}.gguf", budget=3)      # 27 patches: both images, one plan
    for i in range(2):
        got = features(dev, enc, golden[f"patches_{i}"], golden[f"positions_{i}"])
        want = golden[f"features_{i}"]
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= 2e-3 * np.abs(want).max(), np.abs(got - want).max()


def test_soft_tokens_match_the_reference(dev):
    """The numpy oracle on the same bytes: closer than transformers' float32 (same op order)."""
    from pyapp.families.gemma4_vision.reference import VisionEncoder
    golden = np.load(FORMS / "ollama-dense.vision.npz")
    g = read_gguf(FORMS / "ollama-dense-published.gguf")
    enc = load(dev, FORMS / "ollama-dense-published.gguf", budget=3)
    for i in range(2):
        patches, positions = golden[f"patches_{i}"], golden[f"positions_{i}"]
        want = VisionEncoder(g).features(patches, positions)
        got = features(dev, enc, patches, positions)
        assert np.abs(got - want).max() <= 1e-3 * np.abs(want).max()


def test_an_image_too_big_for_the_plan_is_refused(dev):
    from pyapp.families.gemma4_vision.config import VisionError
    enc = load(dev, FORMS / "ollama-dense.gguf", budget=1)       # 9 patches
    with pytest.raises(VisionError, match="does not fit"):
        enc.encode(bytes(4 * 16 * 16 * 18), 6, 3)
    with pytest.raises(VisionError, match="multiples of 3"):
        enc.encode(bytes(4 * 16 * 16 * 4), 2, 2)


def test_a_text_only_file_has_no_encoder(dev):
    from pyapp.families.gemma4_vision.config import VisionError
    with pytest.raises(VisionError, match="no image encoder"):
        load(dev, FORMS / "llamacpp-dense-fused-qkv.gguf")


def soft_run(dev, enc, golden, i, at):
    from pyapp.runtime.soft_tokens import SoftRun
    pixels, across, down = rgba_of(golden[f"patches_{i}"], golden[f"positions_{i}"], enc.cfg.patch)
    n = across * down // enc.cfg.pool ** 2
    return SoftRun(at=at, rows=enc.encode(pixels, across, down), n=n, key=f"image {i}")


def placeholder_runs(tokens: list[int], image_token: int) -> list[int]:
    return [i for i, t in enumerate(tokens) if t == image_token and (i == 0 or tokens[i - 1] != image_token)]


@pytest.mark.parametrize("stem,chunk", [("ollama-dense", 64), ("ollama-moe-published", 64),
                                        ("ollama-moe-published", 4)])
def test_logits_with_images_match_transformers(dev, stem, chunk):
    """The text engine with the encoder's soft tokens at the placeholder runs gives transformers' logits,
    for one image and for two: the E2B-like fixture causal (its per-layer inputs from the pad id), the
    MoE one as 26B-A4B, each image's tokens seeing each other both ways on sliding layers (steps of 4
    tokens: the engine ends a step before an image rather than split it); without them it does not."""
    from pyapp.engine import Engine
    golden = np.load(FORMS / f"{stem.removesuffix('-published')}.vision.npz")
    enc = load(dev, FORMS / f"{stem}.gguf", budget=3)
    eng = Engine.open(FORMS / f"{stem}.gguf", device=dev, context_length=64, chunk=chunk, int8=False)
    assert eng.config.image_attention_both_ways == ("moe" in stem)
    image_token = eng.gguf.metadata["tokenizer.ggml.tokens"].index("<|image|>")
    for name in ("image", "two_image"):
        tokens, want = [int(t) for t in golden[f"{name}_tokens"]], golden[f"{name}_logits"]
        runs = [soft_run(dev, enc, golden, 1, at) for at in placeholder_runs(tokens, image_token)]
        assert all(t == image_token for r in runs for t in tokens[r.at:r.end])
        got = np.asarray(eng.forward(tokens, soft=runs))
        assert np.abs(got - want).max() < 2e-3 and (got.argmax(-1) == want.argmax(-1)).all()
        assert np.abs(np.asarray(eng.forward(tokens)) - want).max() > 0.1


def test_an_image_longer_than_a_step_is_refused_where_it_must_stay_whole(dev):
    from pyapp.engine import Engine, EngineError
    golden = np.load(FORMS / "ollama-moe.vision.npz")
    enc = load(dev, FORMS / "ollama-moe-published.gguf", budget=3)
    eng = Engine.open(FORMS / "ollama-moe-published.gguf", device=dev, context_length=64, chunk=2, int8=False)
    tokens = [int(t) for t in golden["image_tokens"]]
    with pytest.raises(EngineError, match="does not fit one step"):
        eng.forward(tokens, soft=[soft_run(dev, enc, golden, 1, tokens.index(7))])


@pytest.mark.parametrize("stem,chunk", [("ollama-dense", 512), ("ollama-moe-published", 1120)])
def test_the_default_step_holds_the_largest_image_where_it_must_stay_whole(dev, stem, chunk):
    """Loaded without a chunk, a model whose images attend both ways (26B-A4B, 31B) takes prefill steps of
    the largest image budget's soft tokens (1120), so no budget the app offers is refused; the others keep
    512. The memory plan counts the wider step's activations."""
    from pyapp.engine import DEFAULT_CHUNK, Engine
    from pyapp.families.gemma4_vision.config import BUDGETS
    assert chunk in (DEFAULT_CHUNK, max(BUDGETS))
    eng = Engine.open(FORMS / f"{stem}.gguf", device=dev, context_length=64, int8=False)
    assert eng.runner.chunk == chunk and chunk in eng.runner.step_sizes
    wide = Engine.plan(eng.gguf, dev.limits, context_length=64)
    narrow = Engine.plan(eng.gguf, dev.limits, context_length=64, chunk=DEFAULT_CHUNK)
    assert (wide.state > narrow.state) == (chunk > DEFAULT_CHUNK)


def test_the_cache_keeps_a_prefix_only_with_the_same_image(dev):
    """A chat's next turn reuses the cached image only when the same image sits at the same place; the
    same ids with another image are evaluated again, and give that image's answer."""
    from pyapp.engine import Engine
    from pyapp.sampling import SamplingParams
    golden = np.load(FORMS / "ollama-dense.vision.npz")
    enc = load(dev, FORMS / "ollama-dense.gguf", budget=3)
    eng = Engine.open(FORMS / "ollama-dense.gguf", device=dev, context_length=64, int8=False)
    begin, soft, end = 6, 7, 8
    prompt = [2, 300, begin] + [soft] * 2 + [end, 301, 302]       # image 0: 2 soft tokens
    greedy = SamplingParams(temperature=0, max_tokens=3)
    first = eng.generate(prompt, greedy, soft=[soft_run(dev, enc, golden, 0, 3)])
    again = eng.generate(prompt, greedy, soft=[soft_run(dev, enc, golden, 0, 3)])
    assert again.cached_tokens == len(prompt) - 1 and again.tokens == first.tokens
    other = soft_run(dev, enc, golden, 0, 3)
    pixels, across, down = rgba_of(golden["patches_0"][::-1].copy(), golden["positions_0"], 16)
    other = type(other)(at=3, rows=enc.encode(pixels, across, down), n=2, key="image 0 reversed")
    changed = eng.generate(prompt, greedy, soft=[other])
    assert changed.cached_tokens == 3                    # up to the image, not past it
    fresh = Engine.open(FORMS / "ollama-dense.gguf", device=dev, context_length=64, int8=False)
    assert changed.tokens == fresh.generate(prompt, greedy, soft=[other]).tokens


def test_soft_tokens_outside_the_prompt_are_refused(dev):
    from pyapp.engine import Engine, EngineError
    from pyapp.runtime.soft_tokens import SoftRun
    eng = Engine.open(FORMS / "ollama-dense.gguf", device=dev, context_length=64, int8=False)
    rows = dev.buffer(4 * 2 * eng.config.hidden)
    prompt = [2, 6, 7, 7, 8]
    for runs in ([SoftRun(3, rows, 2, "x")],                            # over the last token
                 [SoftRun(-1, rows, 2, "x")], [SoftRun(2, rows, 0, "x")],   # before the prompt, empty
                 [SoftRun(1, rows, 2, "x"), SoftRun(2, rows, 2, "y")]):     # overlapping
        with pytest.raises(EngineError, match="do not fit"):
            eng.forward(prompt, soft=runs)
        with pytest.raises(EngineError, match="do not fit"):
            eng.generate(prompt, soft=runs)


# ---- the 12B: its patch projection (gemma4uv) --------------------------------------------------------------

def patch_projection_features(dev, enc, rgb: bytes, width: int, height: int) -> np.ndarray:
    from pyapp.families.gemma4_vision.preprocess import to_rgba
    across, down = width // enc.cfg.patch, height // enc.cfg.patch
    out = enc.encode(bytes(to_rgba(rgb, width, height)), across, down)
    return np.frombuffer(dev.read(out, 0, 4 * across * down * enc.cfg.text_hidden), np.float32).reshape(
        across * down, -1)


@pytest.mark.parametrize("stem", ["mmproj-12b", "mmproj-12b-bf16"])
def test_the_12bs_soft_tokens_match_transformers(dev, stem):
    """The GPU patch projection on llama.cpp's projector files of the 12B (F16, BF16): transformers'
    get_image_features for a wide and a tall image at budgets 70 and 140, one plan for all four (RGBA8
    pixels in, patches cut and scaled to [0, 1] on the GPU); the numpy oracle on the same file closer still."""
    from pyapp.families.gemma4_vision.encoder import encoder_class
    from pyapp.families.gemma4_vision.projection import PatchProjectionEncoder
    from pyapp.families.gemma4_vision.reference import PatchProjection
    from support.unified_images import case_image, golden, patches_of
    gold = golden(stem)
    g = read_gguf(FORMS / f"{stem}.gguf")
    assert encoder_class(g) is PatchProjectionEncoder
    enc = load(dev, FORMS / f"{stem}.gguf", budget=140)
    assert isinstance(enc, PatchProjectionEncoder) and enc.max_patches == 140
    oracle = PatchProjection(g)
    for i in range(4):
        image = case_image(gold, i)
        got = patch_projection_features(dev, enc, *image)
        want = gold[f"features_{i}"]
        assert got.shape == want.shape == (gold[f"case_{i}"][3], 128)
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max(), np.abs(got - want).max()
        assert np.abs(got - oracle.features(*patches_of(*image))).max() <= 1e-4 * np.abs(want).max()


def test_the_12bs_images_beyond_the_plan_or_the_position_table_are_refused(dev):
    from pyapp.families.gemma4_vision.config import VisionError
    enc = load(dev, FORMS / "mmproj-12b.gguf", budget=70)
    with pytest.raises(VisionError, match="at most 70 patches"):
        enc.encode(bytes(4 * 48 * 48 * 72), 9, 8)
    with pytest.raises(VisionError, match="position table holds 64 a side"):
        enc.encode(bytes(4 * 48 * 48 * 65), 65, 1)


@pytest.mark.parametrize("stem,chunk,prompts", [("mmproj-12b", 1120, ("image", "two_image")),
                                                ("mmproj-12b-bf16", 1120, ("image", "two_image")),
                                                ("mmproj-12b", 8, ("two_image",))])
def test_the_12bs_logits_with_images_match_transformers(dev, stem, chunk, prompts):
    """llama.cpp's text GGUF of the 12B on the GPU with the patch projection's soft tokens at the placeholder
    runs: transformers' logits (generate's masks) for one image and for two, within 2e-2 and the same argmax;
    in steps of 8 tokens too (the engine ends a step before an image: the 12B's images attend both ways on
    sliding layers); without the images far off."""
    from pyapp.engine import Engine
    from pyapp.runtime.soft_tokens import SoftRun
    from support.unified_images import SOFT, case_image, golden, small_image
    gold = golden(stem)
    enc = load(dev, FORMS / f"{stem}.gguf", budget=70)
    eng = Engine.open(FORMS / "gemma4-12b.gguf", device=dev, context_length=128, chunk=chunk, int8=False)
    assert eng.config.image_attention_both_ways
    images = {"image": [case_image(gold, 0)], "two_image": [small_image(gold, 0), small_image(gold, 1)]}
    for name in prompts:
        pictures = images[name]
        tokens, want = [int(t) for t in gold[f"{name}_tokens"]], gold[f"{name}_logits"]
        starts = placeholder_runs(tokens, SOFT)
        runs = []
        for at, (rgb, width, height) in zip(starts, pictures):
            n = (width // 48) * (height // 48)
            rows = enc.encode(bytes(to_rgba(rgb, width, height)), width // 48, height // 48)
            runs.append(SoftRun(at=at, rows=rows, n=n, key=f"{name} {at}"))
        assert all(t == SOFT for r in runs for t in tokens[r.at:r.end])
        got = np.asarray(eng.forward(tokens, soft=runs))
        assert np.abs(got - want).max() <= 2e-2 and (got.argmax(-1) == want.argmax(-1)).all(), np.abs(got - want).max()
        assert np.abs(np.asarray(eng.forward(tokens)) - want).max() > 0.1
