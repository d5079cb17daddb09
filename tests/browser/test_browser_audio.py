"""Audio in the chat, in headless Chromium (WebGPU on SwiftShader): the built app in dist/, on the E2B-like fixture
whose audio encoder is inline in Ollama's blob (the one the CLI's audio tests use).

The session's Chromium (tests/browser/conftest.py) has a fake microphone that plays a chirp from a WAV made by
support.audio (--use-fake-device-for-media-stream --use-file-for-fake-audio-capture; --use-fake-ui-for-media-stream
and the page's context grant it): the Record button records it (the
level meter moves, the time counts against 30 s), Stop ends it, the page decodes and resamples the recording to
16 kHz with Web Audio and keeps the samples in OPFS; sent, the reply's greedy tokens equal the native app layer's
(pyapp.app.audio + AudioEncoder + the text engine on wgpu) on the very samples the page kept (the fake device's
capture, Opus and the resampling are the browser's, so the WAV itself would not do). A WAV file attached by the
button likewise (44.1 kHz stereo, resampled and averaged in the page), then a worker that lost its clips (as after
a reload or a model change) says which and the page adds them again from OPFS (same reply); a file over 30 s and
one that is no audio are refused in words. llama.cpp's text GGUF (no audio encoder) disables both buttons and says
why. Screenshots: tests/screenshots/audio-{attached,recorder,sent,no-encoder}.png.
"""

from __future__ import annotations

from array import array

import pytest

from support.audio import wav
from support.browser import (FIXTURES, SCREENSHOTS, click_and_wait_reply, fresh_chat, messages, read_opfs_file,
                             regenerate, wait_idle, wait_loaded_file, wait_state)

pytestmark = pytest.mark.browser

DENSE = FIXTURES / "forms" / "ollama-dense.gguf"             # a tiny E2B-like Gemma 4, its audio encoder inline
TEXT_ONLY = FIXTURES / "forms" / "llamacpp-dense-fused-qkv.gguf"   # the same model as llama.cpp writes its text
MAX_TOKENS = 6


def open_model(page, path) -> None:
    """This model loaded (opened again only when another one is chosen or it is not loaded)."""
    wait_idle(page)
    if page.evaluate("window.app.state.model && window.app.state.model.file") == path.name and \
            page.evaluate("window.app.state.loaded"):
        return
    page.set_input_files("#file-input", str(path))
    wait_loaded_file(page, path.name)


def stored_samples(page, clip_id: str) -> array:
    """The 16 kHz samples the page keeps for a clip (OPFS audio/<id>.f32): those the model heard."""
    samples = array("f")
    samples.frombytes(read_opfs_file(page, "audio", f"{clip_id}.f32"))
    return samples


def native_reply(samples, text: str) -> dict:
    """The native app layer's greedy reply to one user message: the clip (these samples) then the text."""
    from pyapp.app import audio, model
    from pyapp.app.reply import reply
    from pyapp.app.session import Session
    from pyapp.gguf import read_gguf
    from pyapp.steps import run
    s = Session()
    g = read_gguf(DENSE)
    model.choose(s, g, model.describe(g, DENSE.name))
    run(model.load(s, context_length=1024))
    clip = run(audio.encode_clip(s, samples))
    content = [{"type": "audio", "key": clip.key}, {"type": "text", "text": text}]
    return run(reply(s, [{"role": "user", "content": content}], {"temperature": 0, "max_tokens": MAX_TOKENS}))


def send_and_compare(page, text: str, clip: dict) -> dict:
    """Send the message with its clip; the reply equals the native app layer's on the samples the page kept."""
    page.fill("#prompt", text)
    click_and_wait_reply(page, "#send")
    wait_state(page, "loaded")
    assert page.inner_text("#chat-error") == ""
    sent, got = messages(page)[-2:]
    assert sent["content"] == text and [c["id"] for c in sent["audio"]] == [clip["id"]] and sent["audio"][0]["key"]
    samples = stored_samples(page, clip["id"])
    assert len(samples) == clip["samples"]
    want = native_reply(samples, text)
    assert got["ids"] == want["ids"] and got["content"] == want["text"]
    # the clip's soft tokens were read (a conversation before may leave the prompt's opening in the cache)
    assert want["prompt_tokens"] >= got["stats"]["evaluated"] > clip["tokens"]
    assert page.is_visible(".msg.user .msg-audio audio.clip-player")
    page.wait_for_function("(document.querySelector('.msg.user .msg-audio audio') || {}).src?.startsWith('blob:')")
    return want


def test_a_recording_is_answered_as_natively(page):
    pytest.importorskip("wgpu")
    open_model(page, DENSE)
    assert "hears audio" in page.inner_text("#model-info .parts")
    assert page.is_enabled("#record") and page.is_enabled("#attach-audio") and page.is_hidden("#audio-why")
    fresh_chat(page, max_tokens=MAX_TOKENS)
    page.evaluate("window.app.state.audio.attached = []")
    page.focus("#record")
    page.keyboard.press("Enter")                          # the keyboard starts it
    page.wait_for_function("window.app.state.audio.recording !== null")
    assert page.is_visible("#recorder") and page.get_attribute("#record", "aria-pressed") == "true"
    assert page.evaluate("document.activeElement.id") == "rec-stop"
    page.wait_for_function("parseFloat(document.getElementById('rec-time').textContent) >= 1.6")
    assert page.inner_text("#rec-time").endswith("/ 30 s")
    assert page.is_disabled("#send")                      # nothing is sent while it records
    page.wait_for_function("document.getElementById('rec-level').value > 0")      # the chirp moves the meter
    # (no screenshot here: headless Chromium's screenshot waits while the fake capture runs, past the 30 s limit)
    page.keyboard.press("Enter")                          # Stop, focused
    page.wait_for_function("window.app.state.audio.attached.length === 1")
    assert page.is_hidden("#recorder") and page.get_attribute("#record", "aria-pressed") == "false"
    clip = page.evaluate("window.app.state.audio.attached[0]")
    assert clip["name"].startswith("Recording ") and 1.5 * 16_000 < clip["samples"] < 4 * 16_000
    assert clip["tokens"] == page.evaluate(f"window.app.call('clip_tokens', {clip['samples']})")["tokens"]
    assert "1 clip with the next message" in page.inner_text("#audio-status")
    # the composer's player plays a WAV of the clip's 16 kHz samples, as long as the clip
    page.wait_for_function("document.querySelector('#audio-attachments audio').readyState >= 1")
    duration = page.evaluate("document.querySelector('#audio-attachments audio').duration")
    assert abs(duration - clip["samples"] / 16_000) < 1e-3
    # how the recorder looks (shown again with set figures: the screenshot cannot be taken while it records)
    page.evaluate("""() => {
        document.getElementById('recorder').hidden = false;
        document.getElementById('rec-level').value = 0.6;
        document.getElementById('rec-time').textContent = '12.3 s / 30 s';
    }""")
    page.locator("#composer").screenshot(path=str(SCREENSHOTS / "audio-recorder.png"), animations="disabled")
    page.evaluate("document.getElementById('recorder').hidden = true")
    page.screenshot(path=str(SCREENSHOTS / "audio-attached.png"))
    send_and_compare(page, "What do you hear?", clip)
    assert page.inner_text("#audio-attachments") == "" and page.input_value("#prompt") == ""
    page.screenshot(path=str(SCREENSHOTS / "audio-sent.png"))


def test_a_recording_stops_itself_at_the_limit(page):
    """The limit shortened to 2 s (30 s in use: seen to stop at 480,000 samples, but then the test would wait)."""
    open_model(page, DENSE)
    page.evaluate("window.app.state.audio.attached = []; window.app.state.audio.limit = 2")
    try:
        page.click("#record")
        page.wait_for_function("window.app.state.audio.recording !== null")
        assert page.inner_text("#rec-time").endswith("/ 2 s")
        page.wait_for_function("window.app.state.audio.attached.length === 1")      # nobody pressed Stop
    finally:
        page.evaluate("window.app.state.audio.limit = 30")
    clip = page.evaluate("window.app.state.audio.attached[0]")
    assert 1.7 * 16_000 <= clip["samples"] <= 2.5 * 16_000
    assert page.is_hidden("#recorder") and page.inner_text("#record") == "Record"
    page.click("#audio-attachments .remove-clip")
    assert page.evaluate("window.app.state.audio.attached.length") == 0


def test_microphone_errors_are_said_in_words(page):
    """No microphone, the permission refused, one in use: each said in plain words, and nothing records."""
    open_model(page, DENSE)
    try:
        for name, words in (("NotFoundError", "No microphone was found"),
                            ("NotAllowedError", "The browser did not allow the microphone: allow it for this page"),
                            ("NotReadableError", "another program may be using it")):
            page.evaluate("""(name) => {
                document.getElementById('audio-error').textContent = '';
                navigator.mediaDevices.getUserMedia = () => Promise.reject(new DOMException('refused', name));
            }""", name)
            page.click("#record")
            page.wait_for_function("document.getElementById('audio-error').textContent.length > 0")
            assert words in page.inner_text("#audio-error")
            assert page.evaluate("window.app.state.audio.recording") is None and page.is_enabled("#record")
    finally:
        page.evaluate("""() => {
            delete navigator.mediaDevices.getUserMedia;         // the browser's own again
            document.getElementById('audio-error').textContent = '';
        }""")


def test_an_attached_wav_is_answered_as_natively_and_added_again_when_lost(page, tmp_path):
    pytest.importorskip("wgpu")
    open_model(page, DENSE)
    fresh_chat(page, max_tokens=MAX_TOKENS)
    page.evaluate("window.app.state.audio.attached = []")
    # over 30 s: refused in words; not audio: said so
    page.set_input_files("#audio-input", {"name": "long.wav", "mimeType": "audio/wav", "buffer": wav(8000, 31.0)})
    page.wait_for_function("document.getElementById('audio-error').textContent.length > 0")
    assert "\u201clong.wav\u201d is 31.0 s long, and Gemma 4 hears at most 30 s a clip" in \
        page.inner_text("#audio-error")
    page.evaluate("document.getElementById('audio-error').textContent = ''")
    page.set_input_files("#audio-input", {"name": "notes.mp3", "mimeType": "audio/mpeg", "buffer": b"not audio" * 50})
    page.wait_for_function("document.getElementById('audio-error').textContent.length > 0")
    assert "\u201cnotes.mp3\u201d is not audio this browser can read" in page.inner_text("#audio-error")
    assert page.evaluate("window.app.state.audio.attached.length") == 0
    # a 44.1 kHz stereo WAV: resampled to 16 kHz and its channels averaged in the page
    path = tmp_path / "chirp.wav"
    path.write_bytes(wav(44_100, 1.25, channels=2))
    page.set_input_files("#audio-input", str(path))
    page.wait_for_function("window.app.state.audio.attached.length === 1")
    clip = page.evaluate("window.app.state.audio.attached[0]")
    assert (clip["name"], clip["samples"], clip["tokens"]) == ("chirp.wav", 20_000, 31)
    assert page.inner_text("#audio-attachments .clip-caption") == "chirp.wav · 1.3 s · 31 tokens"
    want = send_and_compare(page, "Transcribe this.", clip)
    # the worker forgets its clips (as after a reload): the reply says which, the page adds them again from OPFS,
    # and Regenerate gives the same reply
    page.evaluate("window.app.state.audio.samples.clear()")      # read back from OPFS, not memory
    page.evaluate("window.app.call('remove_projector')")            # forgets the encoders and what they encoded
    assert regenerate(page)["ids"] == want["ids"]


def test_a_model_without_an_audio_encoder_says_so(page):
    open_model(page, TEXT_ONLY)
    assert page.is_disabled("#record") and page.is_disabled("#attach-audio")
    why = page.inner_text("#audio-why")
    assert "has no audio encoder, so it cannot hear audio" in why and "mmproj" in why
    assert "audio" not in page.inner_text("#model-info .parts")
    page.screenshot(path=str(SCREENSHOTS / "audio-no-encoder.png"))
