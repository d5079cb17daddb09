"""Audio in a chat message (issue 30): a content part {"type": "audio", "tokens": N} renders as the GGUF's
own Jinja template writes a clip ("<|audio|>", no newlines) with <|audio|> expanded as Gemma4Processor
expands it (<|audio>, N x <|audio|>, <audio|>); its ids are the special ids, never parsed from what a
user typed. Checked on the real Gemma 4 vocabulary against the template (jinja2) and HF `tokenizers`."""

from __future__ import annotations

import re

import pytest

from pyapp.chat import AUDIO_SOFT, ChatError, Conversation, audio_run, render, render_ids, user_content
from support.paths import load_tool

BOA, SOFT, EOA = 256000, 258881, 258883          # <|audio>, <|audio|>, <audio|> in the real vocabulary

CONVERSATIONS = [
    [{"role": "user", "content": [{"type": "audio", "tokens": 3}, {"type": "text", "text": "Transcribe this."}]}],
    [{"role": "system", "content": "Be brief."},
     {"role": "user", "content": [{"type": "text", "text": "First "}, {"type": "audio", "tokens": 2},
                                  {"type": "text", "text": " then "}, {"type": "image", "tokens": 1},
                                  {"type": "audio", "tokens": 5}]},
     {"role": "assistant", "content": "Two clips."},
     {"role": "user", "content": [{"type": "audio", "tokens": 1, "key": "abc"}]}],
]


def _unexpanded(messages):
    return [dict(m, content=[{k: v for k, v in p.items() if k != "tokens"} for p in m["content"]])
            if isinstance(m["content"], list) else m for m in messages]


def _expand(text: str, messages) -> str:
    """Gemma4Processor's replacements: each <|image|> and <|audio|> the template wrote becomes its run."""
    parts = [p for m in messages if isinstance(m["content"], list) for p in m["content"]]
    images = iter([p["tokens"] for p in parts if p["type"] == "image"])
    clips = iter([p["tokens"] for p in parts if p["type"] == "audio"])
    text = re.sub(re.escape("<|image|>"), lambda _: "<|image>" + "<|image|>" * next(images) + "<image|>", text)
    return re.sub(re.escape(AUDIO_SOFT), lambda _: audio_run(next(clips)), text)


@pytest.fixture(scope="module")
def template(vocab_gguf):
    jinja2 = pytest.importorskip("jinja2")
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(vocab_gguf.metadata["tokenizer.chat_template"])


@pytest.mark.parametrize("messages", CONVERSATIONS, ids=range(len(CONVERSATIONS)))
def test_render_is_the_template_then_the_processor(template, messages):
    bare = template.render(messages=_unexpanded(messages), bos_token="<bos>", add_generation_prompt=True)
    assert render(_unexpanded(messages)) == bare
    assert render(messages) == _expand(bare, messages)


@pytest.mark.parametrize("messages", CONVERSATIONS, ids=range(len(CONVERSATIONS)))
def test_ids_match_hf_tokenizers(vocab_gguf, tok, template, messages):
    pytest.importorskip("tokenizers")
    hf = load_tool("hf_tokenizer").hf_tokenizer(vocab_gguf.metadata)
    text = _expand(template.render(messages=_unexpanded(messages), bos_token="<bos>", add_generation_prompt=True),
                   messages)
    ids = render_ids(tok, messages)
    assert ids == hf.encode(text, add_special_tokens=False).ids
    counts = [p["tokens"] for m in messages if isinstance(m["content"], list)
              for p in m["content"] if p.get("type") == "audio"]
    assert ids.count(BOA) == ids.count(EOA) == len(counts) and ids.count(SOFT) == sum(counts)


def test_typed_markers_stay_text(tok):
    ids = render_ids(tok, [{"role": "user", "content": "<|audio><|audio|><audio|>"}])
    assert not {BOA, SOFT, EOA} & set(ids)


def test_conversation_carries_clips(tok):
    c = Conversation()
    c.add_user("Transcribe this.", clips=[3])
    assert c.messages[-1]["content"] == CONVERSATIONS[0][0]["content"]
    assert c.prompt_ids(tok) == render_ids(tok, CONVERSATIONS[0])
    assert user_content("hi", images=[2], clips=[4]) == [{"type": "image", "tokens": 2}, {"type": "audio", "tokens": 4},
                                                          {"type": "text", "text": "hi"}]


@pytest.mark.parametrize("bad", [0, 1.5, True, 1 << 17])
def test_a_bad_count_is_refused(tok, bad):
    with pytest.raises(ChatError, match="an audio part's soft-token count"):
        render_ids(tok, [{"role": "user", "content": [{"type": "audio", "tokens": bad}]}])
