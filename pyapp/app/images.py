"""Images in a conversation: the model's image encoder, found and loaded once, and each image's soft tokens.

Where the encoder is (pyapp.families.gemma4_vision.source decides): inline in the model file (Ollama's
original blobs), or a projector file the user adds (llama.cpp's mmproj, Ollama's projector layer). An
image arrives as RGBA8 pixels already resized to the size `image_size` gives (the page resizes with
OffscreenCanvas, the CLI with Pillow); `encode_image` turns it into soft tokens on the GPU, kept by a
digest of its pixels, so a conversation re-sent turn after turn encodes each image once.

    size = image_size(session, width, height)                 # (w, h) to resize to, and its soft tokens
    image = yield from encode_image(session, rgba, w, h)      # EncodedImage: rows on the GPU, n, key
    runs = soft_runs(ids, [image, ...], image_token)          # where each goes in the prompt (SoftRun)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from ..families.gemma4_vision.config import BUDGETS, DEFAULT_BUDGET, VisionError, encoder_config
from ..families.gemma4_vision.encoder import encoder_class
from ..families.gemma4_vision.source import NoImageEncoder, find_image_encoder
from ..runtime.soft_tokens import SoftRun, runs_at
from ..steps import Steps, call
from .session import Session


@dataclass(frozen=True)
class EncodedImage:
    key: str             # digest of the pixels, their size and the budget: equal keys, equal soft tokens
    rows: object         # GPU Buffer: f32 [n, text hidden]
    n: int


def encoder_file(session: Session):
    """The parsed GGUF holding the chosen model's image encoder (pyapp.families.gemma4_vision.source: the
    projector added, else the model file's own, else its Ollama projector layer); VisionError where there
    is none or the projector cannot serve this model."""
    model = session.chosen()
    try:
        return find_image_encoder(model.gguf, session.projector, session.ollama_projector,
                                  projector_name=session.projector_name).gguf
    except NoImageEncoder:
        raise NoImageEncoder("this model has no image encoder: add its projector file (mmproj-*.gguf) beside "
                             "it, or choose a model that takes images") from None


def vision_config(session: Session):
    """The config of the session's image encoder (VisionConfig, or the 12B's PatchProjectionConfig)."""
    return encoder_config(encoder_file(session))


def image_encoder(session: Session, budget: int = DEFAULT_BUDGET) -> Steps:
    """Steps: the session's image encoder (ImageEncoder, or the 12B's PatchProjectionEncoder) for images of up
    to `budget` soft tokens, loaded on first use (and again for a larger budget or another file)."""
    g = encoder_file(session)
    enc = session.image_encoder
    if enc is not None and enc.source is g and enc.max_patches >= enc.cfg.max_patches(budget):
        return enc
    session.loaded()
    if enc is None or enc.source is not g:
        session.encoded_images = {}      # soft tokens of another encoder are not these (a larger budget's are)
    session.image_encoder = enc = yield call(encoder_class(g).open, session.device, g, budget)
    enc.source = g
    return enc


def image_size(session: Session, width: int, height: int, budget: int = DEFAULT_BUDGET) -> dict:
    """The size an image of width x height pixels is resized to before encoding (aspect ratio kept, sides
    multiples of patch * pool, at most `budget` soft tokens), and the soft tokens it then takes."""
    from ..families.gemma4_vision.preprocess import target_size
    cfg = vision_config(session)
    if budget not in BUDGETS:
        raise VisionError(f"an image budget of {budget!r} soft tokens: choose one of {', '.join(map(str, BUDGETS))}")
    w, h = target_size(width, height, budget, cfg.patch, cfg.pool)
    return {"width": w, "height": h, "tokens": (w // cfg.patch) * (h // cfg.patch) // cfg.pool ** 2}


def encode_image(session: Session, rgba, width: int, height: int, budget: int = DEFAULT_BUDGET,
                 digest: bytes | None = None) -> Steps:
    """Steps: the EncodedImage of RGBA8 pixels `width` x `height` (a size image_size gives: bytes, or a GPU
    Buffer holding them), from the cache when the same pixels were encoded before. digest: the pixels'
    SHA-256 when the caller has it (the page computes it in JS; a Buffer's pixels are not in Python)."""
    enc = yield from image_encoder(session, budget)
    p = enc.cfg.patch
    if width % p or height % p:
        raise VisionError(f"an image of {width} x {height} pixels: its sides must be multiples of {p}")
    digest = digest if digest is not None else hashlib.sha256(bytes(rgba)).digest()
    key = hashlib.sha256(b"%d %d %d " % (width, height, budget) + digest).hexdigest()[:32]
    image = session.encoded_images.get(key)
    if image is None:
        rows = enc.encode(rgba, width // p, height // p)
        image = EncodedImage(key, rows, (width // p) * (height // p) // enc.cfg.pool ** 2)
        session.encoded_images[key] = image
    return image


def image_token(tokenizer) -> int:
    """The id of Gemma 4's image soft token, <|image|> (its placeholder runs hold it)."""
    ids = tokenizer.encode_parts([("<|image|>", True)])
    if len(ids) != 1:
        raise VisionError("this model's vocabulary has no <|image|> token: it takes no images")
    return ids[0]


def soft_runs(ids: list[int], images: list[EncodedImage], image_token: int) -> list[SoftRun]:
    """The SoftRun of each image at its placeholder run (pyapp.runtime.soft_tokens.placeholder_starts)."""
    return runs_at(ids, images, image_token, "image")
