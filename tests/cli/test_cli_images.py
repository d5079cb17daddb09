"""The command line with images: `logits --image FILE [--image-tokens N]` on the Ollama-form fixtures
(the encoder inline), the GPU and the numpy reference on the same file and picture, and what is refused
with exit 2 and a plain message."""

import subprocess
import sys

import numpy as np
import pytest

from support.paths import FIXTURES, ROOT

FORMS = FIXTURES / "forms"
BEGIN, SOFT, END = 6, 7, 8          # the fixtures' <|image>, <|image|>, <image|>


def pyapp(*args, check=True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pyapp", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, check=check, timeout=600)


@pytest.fixture(scope="module")
def picture(tmp_path_factory):
    """A 300 x 200 PNG of random pixels: resized (bicubic) to 480 x 288 for 70 soft tokens -> 60 tokens."""
    from PIL import Image
    path = tmp_path_factory.mktemp("img") / "picture.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (200, 300, 3), dtype=np.uint8)).save(path)
    return path


def prompt(n: int) -> str:
    return ",".join(map(str, [2, 300, BEGIN] + [SOFT] * n + [END, 301, 302]))


@pytest.mark.gpu
@pytest.mark.parametrize("stem", ["ollama-dense", "ollama-moe-published"])
def test_logits_with_an_image_native_equal_the_reference(tmp_path, picture, stem):
    out = {}
    for backend in ("native", "reference"):
        path = tmp_path / f"{backend}.npy"
        pyapp("logits", FORMS / f"{stem}.gguf", "--tokens", prompt(60), "--image", picture, "--image-tokens", 70,
              "--out", path, "--backend", backend, "--no-int8")
        out[backend] = np.load(path)
    assert out["native"].shape == (66, 512 if "dense" in stem else out["native"].shape[1])
    assert np.abs(out["native"] - out["reference"]).max() < 1e-3
    assert (out["native"].argmax(-1) == out["reference"].argmax(-1)).all()
    without = tmp_path / "without.npy"
    pyapp("logits", FORMS / f"{stem}.gguf", "--tokens", prompt(60), "--out", without, "--backend", "reference")
    assert np.abs(np.load(without) - out["reference"]).max() > 0.1        # the picture changed the logits


@pytest.mark.parametrize("args,message", [
    (["--tokens", prompt(59)], "is 59 long"),                                    # a run of the wrong length
    (["--tokens", prompt(60), "--image-tokens", 100], "70, 140, 280, 560, 1120"),  # no such budget
    (["--tokens", "2,300,301"], "0 runs"),                                        # no placeholder for it
])
def test_bad_image_input_is_refused(tmp_path, picture, args, message):
    r = pyapp("logits", FORMS / "ollama-dense.gguf", "--image", picture, "--image-tokens", 70, *args,
              "--out", tmp_path / "x.npy", "--backend", "reference", check=False)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_a_file_that_is_not_an_image_is_refused(tmp_path):
    bad = tmp_path / "notes.png"
    bad.write_text("not a picture")
    r = pyapp("logits", FORMS / "ollama-dense.gguf", "--tokens", prompt(60), "--image", bad,
              "--out", tmp_path / "x.npy", "--backend", "reference", check=False)
    assert r.returncode == 2 and "not an image" in r.stderr and "Traceback" not in r.stderr


def test_a_model_without_an_image_encoder_says_so(tmp_path, picture):
    r = pyapp("logits", FORMS / "llamacpp-dense-fused-qkv.gguf", "--tokens", prompt(60), "--image", picture,
              "--image-tokens", 70, "--out", tmp_path / "x.npy", "--backend", "reference", check=False)
    assert r.returncode == 2 and "no image encoder" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.gpu
def test_generate_with_an_image_reads_its_soft_tokens(picture):
    """generate --image: the template places the image before the text; its 60 soft tokens are read with
    the prompt (the summary line counts them), and the greedy reply is the app layer's on the same picture."""
    r = pyapp("generate", FORMS / "ollama-dense.gguf", "--prompt", "What is this?", "--image", picture,
              "--image-tokens", 70, "--max-tokens", 6)
    assert "96 prompt tokens (60 of them the images')" in r.stderr
    from pyapp.__main__ import _loaded, _media_parts, _read_image, parser
    from pyapp.app.reply import reply
    from pyapp.gguf import read_gguf
    from pyapp.sampling import SamplingParams
    from pyapp.steps import run

    args = parser().parse_args(["generate", str(FORMS / "ollama-dense.gguf"), "--prompt", "x", "--context", "2048"])
    session = _loaded(read_gguf(FORMS / "ollama-dense.gguf"), args)
    parts = run(_media_parts(session, [_read_image(str(picture), 70)], [], 70))
    want = run(reply(session, [{"role": "user", "content": parts + [{"type": "text", "text": "What is this?"}]}],
                     params=SamplingParams(temperature=0, max_tokens=6)))
    assert r.stdout.strip() == want["text"].strip() and want["prompt_tokens"] == 96


def test_generate_raw_takes_no_image(picture):
    r = pyapp("generate", FORMS / "ollama-dense.gguf", "--prompt", "x", "--raw", "--image", picture, check=False)
    assert r.returncode == 2 and "--raw takes no --image" in r.stderr


@pytest.mark.gpu
def test_an_image_through_llama_cpps_projector_file(tmp_path, picture):
    """llama.cpp's two files: its text GGUF (no encoder) with --mmproj (the projector its --mmproj writes):
    native equal to the reference; a projector of another model refused."""
    out = {}
    for backend in ("native", "reference"):
        path = tmp_path / f"{backend}.npy"
        pyapp("logits", FORMS / "llamacpp-dense-fused-qkv.gguf", "--tokens", prompt(60), "--image", picture,
              "--image-tokens", 70, "--mmproj", FORMS / "mmproj-dense.gguf", "--out", path, "--backend", backend,
              "--no-int8")
        out[backend] = np.load(path)
    assert np.abs(out["native"] - out["reference"]).max() < 1e-3
    r = pyapp("logits", FORMS / "llamacpp-dense-fused-qkv.gguf", "--tokens", prompt(60), "--image", picture,
              "--image-tokens", 70, "--mmproj", FORMS / "mmproj-moe.gguf", "--out", tmp_path / "x.npy", check=False)
    assert r.returncode == 2 and "belongs to another model" in r.stderr


# ---- the 12B: llama.cpp's text GGUF with its projector (gemma4uv: the patch projection) ------------------------

@pytest.fixture(scope="module")
def golden_picture(tmp_path_factory):
    """The 12B golden's case 0 image (576 x 240, a size the processor keeps at budget 70: 60 soft tokens) as a PNG."""
    from PIL import Image
    from support.unified_images import case_image, golden
    rgb, width, height = case_image(golden("mmproj-12b"), 0)
    path = tmp_path_factory.mktemp("img12b") / "wide.png"
    Image.frombytes("RGB", (width, height), rgb).save(path)
    return path


@pytest.mark.gpu
@pytest.mark.parametrize("projector", ["mmproj-12b", "mmproj-12b-bf16"])
def test_the_12bs_logits_with_an_image_match_transformers(tmp_path, golden_picture, projector):
    """`logits --image PNG --mmproj` on the 12B, natively and by the numpy reference: transformers' logits of the
    same prompt and picture (within 2e-2, the same argmax), each projector file its own golden."""
    from support.unified_images import golden
    gold = golden(projector)
    tokens = ",".join(map(str, gold["image_tokens"]))
    for backend in ("native", "reference"):
        path = tmp_path / f"{backend}.npy"
        pyapp("logits", FORMS / "gemma4-12b.gguf", "--tokens", tokens, "--image", golden_picture, "--image-tokens",
              70, "--mmproj", FORMS / f"{projector}.gguf", "--out", path, "--backend", backend, "--no-int8")
        got, want = np.load(path), gold["image_logits"]
        assert np.abs(got - want).max() <= 2e-2 and (got.argmax(-1) == want.argmax(-1)).all(), backend


@pytest.mark.gpu
def test_the_12bs_logits_with_a_resized_picture_native_equal_the_reference(tmp_path, picture):
    """A picture the CLI resizes (300 x 200 -> 480 x 288: 10 x 6 patches of 48 px): native equal to the reference."""
    out = {}
    for backend in ("native", "reference"):
        path = tmp_path / f"{backend}.npy"
        pyapp("logits", FORMS / "gemma4-12b.gguf", "--tokens", prompt(60), "--image", picture, "--image-tokens", 70,
              "--mmproj", FORMS / "mmproj-12b.gguf", "--out", path, "--backend", backend, "--no-int8")
        out[backend] = np.load(path)
    assert np.abs(out["native"] - out["reference"]).max() < 1e-3
    assert (out["native"].argmax(-1) == out["reference"].argmax(-1)).all()


@pytest.mark.gpu
def test_the_12b_generates_with_an_image(picture):
    """generate --image --mmproj on the 12B: 60 soft tokens read with the prompt, the greedy reply the app layer's."""
    r = pyapp("generate", FORMS / "gemma4-12b.gguf", "--prompt", "What is this?", "--image", picture,
              "--image-tokens", 70, "--mmproj", FORMS / "mmproj-12b.gguf", "--max-tokens", 6)
    assert "of them the images')" in r.stderr and "(60 of them" in r.stderr
    from pyapp.__main__ import _loaded, _media_parts, _read_image, parser
    from pyapp.app.reply import reply
    from pyapp.gguf import read_gguf
    from pyapp.sampling import SamplingParams
    from pyapp.steps import run

    args = parser().parse_args(["generate", str(FORMS / "gemma4-12b.gguf"), "--prompt", "x", "--context", "2048"])
    session = _loaded(read_gguf(FORMS / "gemma4-12b.gguf"), args)
    session.projector = read_gguf(FORMS / "mmproj-12b.gguf")
    parts = run(_media_parts(session, [_read_image(str(picture), 70)], [], 70))
    want = run(reply(session, [{"role": "user", "content": parts + [{"type": "text", "text": "What is this?"}]}],
                     params=SamplingParams(temperature=0, max_tokens=6)))
    assert r.stdout.strip() == want["text"].strip()


@pytest.mark.parametrize("args,message", [
    ([], "no image encoder"),                                                      # the text GGUF alone
    (["--mmproj", FORMS / "mmproj-dense.gguf"], "belongs to another model"),      # another model's projector
])
def test_the_12b_without_its_projector_is_refused(tmp_path, picture, args, message):
    r = pyapp("logits", FORMS / "gemma4-12b.gguf", "--tokens", prompt(60), "--image", picture, "--image-tokens", 70,
              *args, "--out", tmp_path / "x.npy", "--backend", "reference", check=False)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr
