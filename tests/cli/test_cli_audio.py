"""The command line with audio: `logits --audio FILE.wav` on the E2B-like fixture (the encoder inline in
Ollama's blob, or llama.cpp's mmproj beside llama.cpp's text GGUF), the GPU and the numpy reference
against transformers' logits for the same clip (tools/make_audio_golden.py); the 12B with its projector
(`--mmproj mmproj-12b*.gguf`: the raw frames projection, tools/make_unified_audio_golden.py) likewise, and
its `generate --audio`; `generate --audio` with a stereo 44.1 kHz recording; and what is refused with exit 2
and a plain message."""

import subprocess
import sys
import wave

import numpy as np
import pytest

from support.paths import FIXTURES, ROOT

FORMS = FIXTURES / "forms"
BEGIN, SOFT, END = 9, 10, 11          # the fixtures' <|audio>, <|audio|>, <audio|>


def pyapp(*args, check=True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pyapp", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, check=check, timeout=600)


@pytest.fixture(scope="module")
def golden():
    return np.load(FORMS / "ollama-dense.audio.npz")


def write_float_wav(path, samples: np.ndarray, rate: int = 16_000) -> None:
    """A mono IEEE-float WAV holding exactly these float32 samples."""
    data = samples.astype("<f4").tobytes()
    fmt = np.array([3, 1], "<u2").tobytes() + np.array([rate, rate * 4], "<u4").tobytes() + np.array([4, 32], "<u2").tobytes()
    body = b"WAVE" + b"fmt " + len(fmt).to_bytes(4, "little") + fmt + b"data" + len(data).to_bytes(4, "little") + data
    path.write_bytes(b"RIFF" + len(body).to_bytes(4, "little") + body)


@pytest.fixture(scope="module")
def clip(tmp_path_factory, golden):
    path = tmp_path_factory.mktemp("audio") / "clip.wav"
    write_float_wav(path, golden["clip_0"])
    return path


def tokens(golden) -> str:
    return ",".join(str(int(t)) for t in golden["audio_tokens"])


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["native", "reference"])
def test_logits_with_a_clip_match_transformers(tmp_path, golden, clip, backend):
    path = tmp_path / "logits.npy"
    pyapp("logits", FORMS / "ollama-dense.gguf", "--tokens", tokens(golden), "--audio", clip, "--out", path,
          "--backend", backend, "--no-int8")
    got, want = np.load(path), golden["audio_logits"]
    assert got.shape == want.shape
    assert np.abs(got - want).max() < 2e-3 and (got.argmax(-1) == want.argmax(-1)).all()


@pytest.mark.gpu
def test_the_projector_file_gives_a_text_gguf_its_ears(tmp_path, golden, clip):
    """llama.cpp's text GGUF of the same model (Q8_0) with its mmproj: the GPU equals the reference."""
    out = {}
    for backend in ("native", "reference"):
        out[backend] = tmp_path / f"{backend}.npy"
        pyapp("logits", FORMS / "llamacpp-dense-fused-qkv.gguf", "--mmproj", FORMS / "mmproj-dense.gguf",
              "--tokens", tokens(golden), "--audio", clip, "--out", out[backend], "--backend", backend, "--no-int8")
    native, reference = np.load(out["native"]), np.load(out["reference"])
    assert np.abs(native - reference).max() < 1e-3 and (native.argmax(-1) == reference.argmax(-1)).all()


@pytest.mark.gpu
def test_generate_with_a_stereo_recording(tmp_path):
    """A 44.1 kHz stereo PCM16 recording (resampled, channels averaged), placed by the chat template."""
    t = np.arange(int(1.2 * 44_100)) / 44_100
    left, right = 0.3 * np.sin(2 * np.pi * 220 * t), 0.2 * np.sin(2 * np.pi * 330 * t)
    path = tmp_path / "stereo.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(44_100)
        w.writeframes((np.stack([left, right], 1) * 32767).astype("<i2").tobytes())
    r = pyapp("generate", FORMS / "ollama-dense.gguf", "--prompt", "What do you hear?", "--audio", path,
              "--max-tokens", 3, "--no-int8")
    assert "(30 of them the clips')" in r.stderr      # 1.2 s: 119 frames, 30 soft tokens


@pytest.mark.parametrize("setup,message", [
    ("short run", "is 34 long"),                              # a run one token short
    ("no run", "0 runs of the clip token"),                   # no placeholder for it
    ("not wav", "not a WAV file (an MP3 file)"),
    ("too short", "too short to hear"),
    ("no encoder", "no audio encoder"),                       # the MoE fixture hears nothing
])
def test_bad_audio_input_is_refused(tmp_path, golden, clip, setup, message):
    model, ids, audio = FORMS / "ollama-dense.gguf", tokens(golden), clip
    if setup == "short run":
        ids = ids.replace(f"{SOFT},{END}", f"{END}", 1)
    elif setup == "no run":
        ids = "2,300,301"
    elif setup == "not wav":
        audio = tmp_path / "song.wav"
        audio.write_bytes(b"ID3\x04" + bytes(200))
    elif setup == "too short":
        audio = tmp_path / "blip.wav"
        write_float_wav(audio, np.zeros(100, np.float32))
    elif setup == "no encoder":
        model = FORMS / "ollama-moe.gguf"
    r = pyapp("logits", model, "--tokens", ids, "--audio", audio, "--out", tmp_path / "x.npy", "--backend", "reference",
              check=False)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["native", "reference"])
@pytest.mark.parametrize("projector", ["mmproj-12b", "mmproj-12b-bf16"])
def test_the_12b_hears_a_clip_through_its_projector(tmp_path, projector, backend):
    """The 12B's text GGUF with llama.cpp's projector of it: a 16-bit WAV of the golden's clip (its samples
    are multiples of 1/32768) gives transformers' logits, on the GPU and by the reference."""
    gold = np.load(FORMS / f"{projector}.audio.npz")
    wav, path = tmp_path / "clip.wav", tmp_path / "logits.npy"
    with wave.open(str(wav), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16_000)
        w.writeframes(np.round(gold["clip_0"] * 32768).astype("<i2").tobytes())
    pyapp("logits", FORMS / "gemma4-12b.gguf", "--mmproj", FORMS / f"{projector}.gguf", "--tokens", tokens(gold),
          "--audio", wav, "--out", path, "--backend", backend, "--no-int8")
    got, want = np.load(path), gold["audio_logits"]
    assert got.shape == want.shape
    assert np.abs(got - want).max() < 2e-3 and (got.argmax(-1) == want.argmax(-1)).all()


@pytest.mark.gpu
def test_the_12b_generates_and_chats_with_a_clip(tmp_path):
    """generate --audio on the 12B: the chat template's run of one <|audio|> per 32-sample frame of its
    projector (0.1 s: 50); chat --audio with the same clip and words replies the same greedy text; without
    its projector the 12B is refused."""
    path = tmp_path / "tone.wav"
    write_float_wav(path, (0.3 * np.sin(2 * np.pi * 220 * np.arange(1600) / 16_000)).astype(np.float32))
    common = ("--audio", path, "--max-tokens", 4, "--temperature", 0, "--no-int8",
              "--mmproj", FORMS / "mmproj-12b.gguf")
    r = pyapp("generate", FORMS / "gemma4-12b.gguf", "--prompt", "Hear this.", *common)
    assert "(50 of them the clips')" in r.stderr and r.stdout.strip()
    chat = subprocess.run([sys.executable, "-m", "pyapp", "chat", str(FORMS / "gemma4-12b.gguf"),
                           *map(str, common)], cwd=ROOT, input="Hear this.\n\n", capture_output=True, text=True,
                          check=True, timeout=600)
    assert "The first message carries 1 clip(s)." in chat.stdout
    assert chat.stdout.split("> ", 1)[1].startswith(r.stdout.strip()), (chat.stdout, r.stdout)
    r = pyapp("generate", FORMS / "gemma4-12b.gguf", "--prompt", "Hear this.", "--audio", path, "--max-tokens", 3,
              check=False)
    assert r.returncode == 2 and "no audio encoder" in r.stderr and "Traceback" not in r.stderr, r.stderr
