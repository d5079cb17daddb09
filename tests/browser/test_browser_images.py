"""Images in the chat, in headless Chromium (WebGPU on SwiftShader): the built app in dist/.

An image is attached (the file input; a second one dropped on the message box and removed again), shown as a
thumbnail with its token cost, decoded and resized in the worker at the size the model takes for the image
budget set (70 tokens here: the quickest to encode), kept in OPFS, and sent: the reply's greedy tokens equal
the native engine's (pyapp.app.images + ImageEncoder + the text engine on wgpu) on the very pixels the page
used, read back from OPFS (the browser's resampling is not Pillow's, so the file itself would not do). A
worker that lost its images (as after a reload or a model change) says which, and the page adds them again
from OPFS and gets the same reply.

A model whose file holds no image encoder (llama.cpp's text GGUF) disables attaching and says why and how; a
model file or another model's projector offered as its projector is refused in words; the projector
llama.cpp's --mmproj writes for it (tests/fixtures/forms/mmproj-dense.gguf) turns attaching on, and removing it
turns it off. The 12B's text GGUF with its projector (mmproj-12b.gguf: the patch projection) answers an image
as the native app layer does.
Screenshots go to tests/screenshots/ (the composer and the sent message; the model without an encoder).
"""

from __future__ import annotations

import base64
import struct
import zlib

import pytest

from support.browser import (FIXTURES, SCREENSHOTS, click_and_wait_reply, fresh_chat, messages, read_opfs_file,
                             regenerate, wait_idle, wait_loaded_file, wait_state)

pytestmark = pytest.mark.browser

DENSE = FIXTURES / "forms" / "ollama-dense.gguf"             # a tiny E2B-like Gemma 4, its image encoder inline
TEXT_ONLY = FIXTURES / "forms" / "llamacpp-dense-fused-qkv.gguf"   # the same model as llama.cpp writes its text
MMPROJ = FIXTURES / "forms" / "mmproj-dense.gguf"      # its image encoder as llama.cpp's --mmproj writes it
OTHER_MMPROJ = FIXTURES / "forms" / "mmproj-moe.gguf"  # the MoE fixture's: soft tokens 128 wide, not 256
UNIFIED = FIXTURES / "forms" / "gemma4-12b.gguf"       # a tiny 12B (gemma4_unified) as llama.cpp writes its text
UNIFIED_MMPROJ = FIXTURES / "forms" / "mmproj-12b.gguf"   # its patch projection (gemma4uv), llama.cpp's --mmproj
BUDGET = 70
MAX_TOKENS = 8


def png(width: int, height: int, seed: int = 0) -> bytes:
    """An RGB PNG with a pattern in it (no Pillow needed)."""
    rows = b"".join(b"\0" + bytes(((x * 5 + y * 3 + seed) % 256, (x * y + seed * 7) % 256, (x ^ y) % 256)[c]
                                  for x in range(width) for c in range(3)) for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def open_model(page, path) -> None:
    wait_idle(page)
    page.set_input_files("#file-input", str(path))
    wait_loaded_file(page, path.name)


def stored_pixels(page, image_id: str) -> bytes:
    """The resized RGBA pixels the page keeps for an image (OPFS images/<id>.rgba): those the model read."""
    return read_opfs_file(page, "images", f"{image_id}.rgba")


def native_reply(pixels: bytes, width: int, height: int, text: str, path=DENSE, projector=None) -> dict:
    """The native app layer's greedy reply to one user message: the image (these pixels) then the text."""
    from pyapp.app import images, model
    from pyapp.app.reply import reply
    from pyapp.app.session import Session
    from pyapp.gguf import read_gguf
    from pyapp.steps import run
    s = Session()
    g = read_gguf(path)
    model.choose(s, g, model.describe(g, path.name))
    s.projector = read_gguf(projector) if projector else None
    run(model.load(s, context_length=1024))
    image = run(images.encode_image(s, pixels, width, height, BUDGET))
    content = [{"type": "image", "key": image.key}, {"type": "text", "text": text}]
    return run(reply(s, [{"role": "user", "content": content}], {"temperature": 0, "max_tokens": MAX_TOKENS}))


def drop_image(page, selector: str, name: str, data: bytes) -> None:
    page.evaluate("""([selector, name, b64]) => {
        const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
        const dt = new DataTransfer();
        dt.items.add(new File([bytes], name, {type: 'image/png'}));
        const target = document.querySelector(selector);
        for (const type of ['dragover', 'drop'])
            target.dispatchEvent(new DragEvent(type, {dataTransfer: dt, bubbles: true, cancelable: true}));
    }""", [selector, name, base64.b64encode(data).decode()])


def test_an_attached_image_is_answered_as_natively(page, tmp_path):
    pytest.importorskip("wgpu")
    open_model(page, DENSE)
    assert "Takes text and images" in page.inner_text("#model-info")
    assert page.is_enabled("#attach") and page.is_hidden("#attach-why")
    fresh_chat(page, max_tokens=MAX_TOKENS)
    page.select_option("#image_budget", str(BUDGET))
    assert "up to 70 tokens" in page.inner_text("#image-budget-help")
    photo = tmp_path / "pattern.png"
    photo.write_bytes(png(96, 48))
    page.set_input_files("#image-input", str(photo))                  # the button's picker
    page.wait_for_function("window.app.state.images.attached.length === 1")
    drop_image(page, "#prompt", "second.png", png(40, 40, seed=3))     # dropped on the message box ...
    page.wait_for_function("window.app.state.images.attached.length === 2")
    assert page.evaluate("window.app.state.model.file") == DENSE.name    # ... an image, not a model to open
    page.wait_for_function("document.querySelectorAll('#attachments canvas.thumb[data-drawn]').length === 2")
    entry = page.evaluate("window.app.state.images.attached[0]")
    assert (entry["width"], entry["height"], entry["tokens"]) == (528, 240, 55)   # 96 x 48 at a budget of 70
    assert "2 images with the next message" in page.inner_text("#attach-status")
    page.click("#attachments li:nth-child(2) .remove-image")            # ... and removed
    assert page.evaluate("window.app.state.images.attached.length") == 1
    assert page.inner_text("#attachments .thumb-caption") == "55 tokens"
    text = "What is in this picture?"
    page.fill("#prompt", text)
    page.screenshot(path=str(SCREENSHOTS / "image-attached.png"))
    click_and_wait_reply(page, "#send")
    wait_state(page, "loaded")
    assert page.inner_text("#chat-error") == ""
    sent, got = messages(page)[-2:]
    assert sent["content"] == text and [i["id"] for i in sent["images"]] == [entry["id"]] and sent["images"][0]["key"]
    assert page.is_visible(".msg.user .msg-images canvas.thumb")
    assert page.get_attribute(".msg.user .msg-images canvas.thumb", "aria-label") == \
        "pattern.png, 528 × 240 pixels, 55 tokens"
    assert page.inner_text("#attachments") == "" and page.input_value("#prompt") == ""
    pixels = stored_pixels(page, entry["id"])
    assert len(pixels) == 528 * 240 * 4
    want = native_reply(pixels, 528, 240, text)
    assert got["ids"] == want["ids"] and got["content"] == want["text"]
    assert got["stats"]["evaluated"] == want["prompt_tokens"] > 55       # the image's 55 soft tokens were read
    page.screenshot(path=str(SCREENSHOTS / "image-sent.png"))
    # the worker forgets its images (as after a reload): the reply says which, the page adds them again from
    # OPFS, and Regenerate gives the same reply
    page.evaluate("window.app.state.images.pixels.clear()")            # read back from OPFS, not memory
    page.evaluate("window.app.call('remove_projector')")               # a model file's encoder: its images go
    assert regenerate(page)["ids"] == want["ids"]


def test_a_model_without_an_image_encoder_says_so_until_its_projector_is_added(page):
    open_model(page, TEXT_ONLY)
    assert page.is_disabled("#attach")
    why = page.inner_text("#attach-why")
    assert "has no image encoder" in why and "mmproj" in why and "under Projector" in why
    assert "Takes text" in page.inner_text("#model-info") and "images" not in page.inner_text("#model-info .parts")
    page.screenshot(path=str(SCREENSHOTS / "image-no-encoder.png"))
    # a model file, or another model's projector, is refused in words
    for path, words in ((FIXTURES / "demo.gguf", "\u201cdemo.gguf\u201d is a 'gemma4' model, not an image projector"),
                        (OTHER_MMPROJ, "\u201cmmproj-moe.gguf\u201d belongs to another model")):
        page.evaluate("document.getElementById('projector-error').textContent = ''")
        page.set_input_files("#projector-input", str(path))
        page.wait_for_function("document.getElementById('projector-error').textContent.length > 0")
        assert words in page.inner_text("#projector-error") and "Add the mmproj file published with this model" in \
            page.inner_text("#projector-error")
        assert page.is_disabled("#attach")
    # llama.cpp's mmproj for it: images on (nothing reloads: the encoder loads with the first image)
    page.set_input_files("#projector-input", str(MMPROJ))
    page.wait_for_function("!document.getElementById('attach').disabled")
    assert page.inner_text("#projector-error") == "" and "mmproj-dense.gguf" in page.inner_text("#projector-info")
    assert page.is_hidden("#attach-why") and "Takes text and images" in page.inner_text("#model-info")
    assert page.evaluate("window.app.state.loaded")
    # a pasted image is resized for this model (and can be removed)
    page.evaluate("""(b64) => {
        const dt = new DataTransfer();
        dt.items.add(new File([Uint8Array.from(atob(b64), (c) => c.charCodeAt(0))], 'pasted.png', {type: 'image/png'}));
        document.getElementById('prompt').dispatchEvent(new ClipboardEvent('paste', {clipboardData: dt, bubbles: true,
                                                                                      cancelable: true}));
    }""", base64.b64encode(png(64, 64)).decode())
    page.wait_for_function("window.app.state.images.attached.length === 1")
    page.click("#attachments .remove-image")
    assert page.evaluate("window.app.state.images.attached.length") == 0
    # a file that is no image: said in words
    page.set_input_files("#image-input", {"name": "notes.png", "mimeType": "image/png", "buffer": b"not a png" * 10})
    page.wait_for_function("document.getElementById('attach-error').textContent.length > 0")
    assert "\u201cnotes.png\u201d is not an image this browser can read" in page.inner_text("#attach-error")
    page.click("#remove-projector")
    page.wait_for_function("document.getElementById('attach').disabled")
    assert "has no image encoder" in page.inner_text("#attach-why")


def test_the_12b_reads_an_image_through_its_projector(page, tmp_path):
    """The 12B (llama.cpp's text GGUF) with its projector file added (gemma4uv: no encoder, each 48-px square
    projected): an attached image is resized for it (96 x 48 at 70 tokens: 11 x 5 squares) and the reply's
    greedy tokens equal the native app layer's on the pixels the page kept."""
    pytest.importorskip("wgpu")
    open_model(page, UNIFIED)
    assert page.is_disabled("#attach")
    page.set_input_files("#projector-input", str(UNIFIED_MMPROJ))
    page.wait_for_function("!document.getElementById('attach').disabled")
    assert page.inner_text("#projector-error") == "" and "mmproj-12b.gguf" in page.inner_text("#projector-info")
    fresh_chat(page, max_tokens=MAX_TOKENS)
    page.select_option("#image_budget", str(BUDGET))
    photo = tmp_path / "pattern.png"
    photo.write_bytes(png(96, 48))
    page.set_input_files("#image-input", str(photo))
    page.wait_for_function("window.app.state.images.attached.length === 1")
    entry = page.evaluate("window.app.state.images.attached[0]")
    assert (entry["width"], entry["height"], entry["tokens"]) == (528, 240, 55)
    text = "What is in this picture?"
    page.fill("#prompt", text)
    click_and_wait_reply(page, "#send")
    wait_state(page, "loaded")
    assert page.inner_text("#chat-error") == ""
    got = messages(page)[-1]
    want = native_reply(stored_pixels(page, entry["id"]), 528, 240, text, UNIFIED, UNIFIED_MMPROJ)
    assert got["ids"] == want["ids"] and got["content"] == want["text"]
    assert got["stats"]["evaluated"] == want["prompt_tokens"] > 55
