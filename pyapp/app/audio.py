"""Audio in a conversation: the model's audio encoder, found and loaded once, and each clip's soft tokens.

Where the encoder is (pyapp.families.gemma4_audio.source decides): inline in the model file (Ollama's
original blobs of E2B and E4B), or a projector file the user adds (llama.cpp's mmproj, Ollama's projector
layer; the 12B's holds its frames projection, gemma4ua). A clip arrives as 16 kHz mono float32 samples
(the CLI reads WAV files with pyapp.families.gemma4_audio.wav; the page decodes and resamples with Web
Audio); `encode_clip` computes its features (E2B, E4B: log-mel rows, on the GPU; the 12B: raw frames of 640
samples) and its soft tokens on the GPU, kept by a digest of its samples, so a conversation re-sent turn
after turn encodes each clip once. A clip longer than 30 s is heard up to 30 s, as Gemma 4's processor
truncates it. How many soft tokens a clip takes depends on the encoder (one per 40 ms for both, counted
as each processor counts: `EncodedClip.n`).

    clip = yield from encode_clip(session, samples)          # EncodedClip: rows on the GPU, n, key
    runs = clip_runs(ids, [clip, ...], audio_token(tok))     # where each goes in the prompt (SoftRun)
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass

from ..families.gemma4_audio import features
from ..families.gemma4_audio.config import AudioError
from ..families.gemma4_audio.encoder import encoder_class
from ..families.gemma4_audio.source import NoAudioEncoder, find_audio_encoder
from ..runtime.soft_tokens import SoftRun, runs_at
from ..steps import Steps, call
from .session import Session


@dataclass(frozen=True)
class EncodedClip:
    key: str             # digest of the samples: equal keys, equal soft tokens
    rows: object         # GPU Buffer: f32 [n, text hidden]
    n: int


def encoder_file(session: Session):
    """The parsed GGUF holding the chosen model's audio encoder (a projector added that holds one, else the
    model file's own, else its Ollama projector layer); AudioError where there is none or it cannot serve."""
    model = session.chosen()
    return find_audio_encoder(model.gguf, session.projector, session.ollama_projector,
                              projector_name=session.projector_name).gguf


def takes_audio(session: Session) -> bool:
    """Whether the chosen model hears audio here (its encoder found and usable)."""
    try:
        encoder_file(session)
    except NoAudioEncoder:
        return False
    return True


def audio_encoder(session: Session) -> Steps:
    """Steps: the session's AudioEncoder, loaded on first use (and again for another file)."""
    g = encoder_file(session)
    enc = session.audio_encoder
    if enc is not None and enc.source is g:
        return enc
    session.loaded()
    session.encoded_clips = {}           # soft tokens of another encoder are not these
    session.audio_encoder = enc = yield call(encoder_class(g).open, session.device, g)
    enc.source = g
    return enc


def clip_tokens(n_samples: int) -> int:
    """The soft tokens a clip of n_samples (16 kHz) takes on E2B and E4B (the 12B's: its encoder's
    soft_tokens); AudioError for a clip too short to hear (under 10 ms: for every model)."""
    n = features.soft_tokens(n_samples)
    if n == 0:
        raise AudioError(f"a clip of {n_samples} samples ({1000 * n_samples / features.SAMPLE_RATE:.0f} ms) is too "
                         "short to hear: Gemma 4 takes at least 10 ms")
    return n


def encode_clip(session: Session, samples, digest: bytes | None = None) -> Steps:
    """Steps: the EncodedClip of 16 kHz mono samples (floats; the first 30 s are heard), from the cache when
    the same samples were encoded before. digest: the samples' SHA-256 when the caller has it."""
    clip = array("f", samples[:features.MAX_SAMPLES])
    clip_tokens(len(clip))
    enc = yield from audio_encoder(session)
    key = hashlib.sha256(digest if digest is not None else clip.tobytes()).hexdigest()[:32]
    encoded = session.encoded_clips.get(key)
    if encoded is None:
        encoded = EncodedClip(key, enc.encode_clip(clip), enc.soft_tokens(len(clip)))
        session.encoded_clips[key] = encoded
    return encoded


def audio_token(tokenizer) -> int:
    """The id of Gemma 4's audio soft token, <|audio|> (its placeholder runs hold it)."""
    ids = tokenizer.encode_parts([("<|audio|>", True)])
    if len(ids) != 1:
        raise AudioError("this model's vocabulary has no <|audio|> token: it takes no audio")
    return ids[0]


def clip_runs(ids: list[int], clips: list[EncodedClip], token: int) -> list[SoftRun]:
    """The SoftRun of each clip at its placeholder run (pyapp.runtime.soft_tokens.placeholder_starts); a clip's
    soft tokens see each other causally, also on a model whose images attend both ways (the 12B)."""
    return runs_at(ids, clips, token, "clip", both_ways=False)
