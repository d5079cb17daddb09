"""Images in a chat message (issue 28): a content part {"type": "image", "tokens": N} renders as the
GGUF's own Jinja template writes an image ("\\n\\n<|image|>\\n\\n") with <|image|> expanded as
Gemma4Processor expands it (<|image>, N x <|image|>, <image|>), and its ids are the special ids, never
parsed from what a user typed. Checked on the real Gemma 4 vocabulary: against the template (jinja2) and
HF `tokenizers`, against exact ids, and against transformers' Gemma4Processor.apply_chat_template where
transformers and Pillow are installed."""

from __future__ import annotations

import json
import re

import pytest

from pyapp.chat import (IMAGE_SOFT, ChatError, Conversation, image_run, render, render_ids, user_content)
from support.paths import load_tool

BOI, SOFT, EOI = 255999, 258880, 258882          # <|image>, <|image|>, <image|> in the real vocabulary

ONE = [{"role": "user", "content": [{"type": "image", "tokens": 3}, {"type": "text", "text": "What is this?"}]}]
TWO = [{"role": "user", "content": [{"type": "text", "text": "Compare"}, {"type": "image", "tokens": 2},
                                    {"type": "image", "tokens": 1}, {"type": "text", "text": " "}]}]
CONVERSATIONS = [
    ONE, TWO,
    [{"role": "system", "content": "Be brief."},
     {"role": "user", "content": [{"type": "text", "text": " Look: "}, {"type": "image", "tokens": 4},
                                  {"type": "text", "text": "and here "}, {"type": "image", "tokens": 5},
                                  {"type": "text", "text": "what differs?"}]},
     {"role": "assistant", "content": "<|channel>thought\nhm<channel|>The colour."},
     {"role": "user", "content": [{"type": "image", "tokens": 1}]}],
    [{"role": "user", "content": "plain text <|image|> typed"},
     {"role": "assistant", "content": [{"type": "text", "text": "see"}, {"type": "image", "tokens": 2}]},
     {"role": "user", "content": [{"type": "image", "tokens": 6, "key": "abc"}, {"type": "text", "text": "\n"}]}],
]


def _unexpanded(messages):
    """The messages as the template sees them: image parts carry no count."""
    return [dict(m, content=[{k: v for k, v in p.items() if k != "tokens"} for p in m["content"]])
            if isinstance(m["content"], list) else m for m in messages]


def _expand(text: str, messages) -> str:
    """Gemma4Processor's replacement: the i-th <|image|> the template wrote becomes image i's run (the
    processor would expand a typed one too: that is the difference under test in conversation 3)."""
    counts = iter([p["tokens"] for m in messages if isinstance(m["content"], list)
                   for p in m["content"] if p.get("type") == "image"])
    margin = "\n\n"
    return re.sub(re.escape(margin + IMAGE_SOFT + margin), lambda _: margin + image_run(next(counts)) + margin, text)


@pytest.fixture(scope="module")
def template(vocab_gguf):
    jinja2 = pytest.importorskip("jinja2")
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(vocab_gguf.metadata["tokenizer.chat_template"])


@pytest.mark.parametrize("messages", CONVERSATIONS, ids=range(len(CONVERSATIONS)))
@pytest.mark.parametrize("thinking", [False, True])
def test_render_is_the_template_then_the_processor(template, messages, thinking):
    kwargs = {"enable_thinking": True} if thinking else {}
    bare = template.render(messages=_unexpanded(messages), bos_token="<bos>", add_generation_prompt=True, **kwargs)
    assert render(_unexpanded(messages), thinking=thinking) == bare           # no counts: the template's text
    assert render(messages, thinking=thinking) == _expand(bare, messages)


@pytest.fixture(scope="module")
def hf(vocab_gguf):
    pytest.importorskip("tokenizers")
    return load_tool("hf_tokenizer").hf_tokenizer(vocab_gguf.metadata)


@pytest.mark.parametrize("messages", CONVERSATIONS, ids=range(len(CONVERSATIONS)))
def test_ids_match_hf_tokenizers(hf, tok, template, messages):
    """HF `tokenizers` (the processor's tokenizer) on the processor's text: the same ids; the image
    markers where the images are, and nowhere else (a typed "<|image|>" stays text)."""
    text = _expand(template.render(messages=_unexpanded(messages), bos_token="<bos>", add_generation_prompt=True),
                   messages)
    ids = render_ids(tok, messages)
    typed = any("<|image|>" in m["content"] for m in messages if isinstance(m["content"], str))
    if not typed:                    # HF's tokenizer would make a typed <|image|> the special token
        assert ids == hf.encode(text, add_special_tokens=False).ids
    counts = [p["tokens"] for m in messages if isinstance(m["content"], list)
              for p in m["content"] if p.get("type") == "image"]
    assert ids.count(BOI) == ids.count(EOI) == len(counts) and ids.count(SOFT) == sum(counts)


def test_exact_ids(tok):
    """One image before the text; two images between texts (the newlines merge: "\\n\\n\\n" after the
    role, "\\n\\n\\n\\n" between two images)."""
    assert render_ids(tok, ONE) == [2, 105, 2364, 109, BOI, SOFT, SOFT, SOFT, EOI, 108, 3689, 563, 672, 236881,
                                    106, 107, 105, 4368, 107, 100, 45518, 107, 101]
    assert render_ids(tok, TWO) == [2, 105, 2364, 107, 44438, 108, BOI, SOFT, SOFT, EOI, 110, BOI, SOFT, EOI, 108,
                                    106, 107, 105, 4368, 107, 100, 45518, 107, 101]
    assert tok.decode([109]) == "\n\n\n" and tok.decode([110]) == "\n\n\n\n" and tok.decode([108]) == "\n\n"


def test_typed_markers_stay_text(tok):
    messages = [{"role": "user", "content": [{"type": "text", "text": "<|image><|image|><image|> <|image|>"}]}]
    ids = render_ids(tok, messages)
    assert not {BOI, SOFT, EOI} & set(ids)
    assert "user\n<|image><|image|><image|> <|image|>" in tok.decode(ids)      # the characters, as typed


def test_conversation_carries_images(tok):
    c = Conversation()
    c.add_user("What is this?", images=[3])
    assert c.messages[-1]["content"] == ONE[0]["content"]
    assert c.prompt_ids(tok) == render_ids(tok, ONE)
    again = Conversation.from_dict(json.loads(json.dumps(c.to_dict())))       # saved as JSON, reopened
    assert again.prompt_ids(tok) == c.prompt_ids(tok)
    c.add_assistant("A cat.")
    c.edit_last_user("And this?", images=[{"type": "image", "tokens": 2, "key": "k"}])
    assert c.messages == [{"role": "user", "content": [{"type": "image", "tokens": 2, "key": "k"},
                                                       {"type": "text", "text": "And this?"}]}]
    assert user_content("hi") == "hi"


@pytest.mark.parametrize("bad", [0, -1, 1.5, "3", True, 1 << 17])
def test_a_bad_count_is_refused(tok, bad):
    with pytest.raises(ChatError, match="soft-token count"):
        render_ids(tok, [{"role": "user", "content": [{"type": "image", "tokens": bad}]}])


@pytest.mark.slow
def test_transformers_processor(vocab_gguf, tok, tmp_path, monkeypatch):
    """Gemma4Processor.apply_chat_template itself (its PIL image processor; the tokenizer our
    hf_tokenizer builds from the real vocabulary, with the image tokens named as Google's
    tokenizer_config names them), on decoded images of two shapes and one and two images per message."""
    Image = pytest.importorskip("PIL.Image")
    pytest.importorskip("transformers")
    import numpy as np
    from transformers import AutoTokenizer
    from transformers.models.gemma4 import Gemma4AudioFeatureExtractor, Gemma4ImageProcessorPil, Gemma4Processor
    from transformers.processing_utils import ProcessorMixin

    from pyapp.families.gemma4_vision.preprocess import soft_tokens, target_size
    load_tool("hf_tokenizer").write_tokenizer(vocab_gguf.metadata, tmp_path)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    cfg["extra_special_tokens"] = {"image_token": "<|image|>", "boi_token": "<|image>", "eoi_token": "<image|>",
                                   "audio_token": "<|audio|>", "boa_token": "<|audio>", "eoa_token": "<audio|>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    # no torchvision here: the video processor (unused) is a stand-in, so the class check is skipped
    monkeypatch.setattr(ProcessorMixin, "check_argument_for_proper_class", lambda self, name, arg: None)
    proc = Gemma4Processor(feature_extractor=Gemma4AudioFeatureExtractor(), image_processor=Gemma4ImageProcessorPil(),
                           tokenizer=AutoTokenizer.from_pretrained(tmp_path), video_processor=object(),
                           chat_template=vocab_gguf.metadata["tokenizer.chat_template"])
    rng = np.random.default_rng(0)
    sizes = ((300, 200), (1000, 30))
    images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in sizes]
    for budget in (70, 280):
        counts = [soft_tokens(*target_size(w, h, budget)) for w, h in sizes]
        for layout in (["image", "What is this?"], ["Compare ", "image", " and", "image", "please."]):
            i = iter(range(2))
            theirs, ours = [], []
            for item in layout:
                if item == "image":
                    k = next(i)
                    theirs.append({"type": "image", "image": images[k]})
                    ours.append({"type": "image", "tokens": counts[k]})
                else:
                    theirs.append({"type": "text", "text": item})
                    ours.append({"type": "text", "text": item})
            out = proc.apply_chat_template([{"role": "user", "content": theirs}], tokenize=True, return_dict=True,
                                           add_generation_prompt=True, images_kwargs={"max_soft_tokens": budget})
            want = [int(t) for t in np.asarray(out["input_ids"]).reshape(-1)]
            assert render_ids(tok, [{"role": "user", "content": ours}]) == want
            assert want.count(SOFT) == sum(counts[:layout.count("image")])
