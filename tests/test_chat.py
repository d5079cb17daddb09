"""pyapp.chat against the Jinja chat template carried in the real Gemma 4 GGUF."""

import pytest

from pyapp.chat import Conversation, render, split_thinking, strip_thinking

jinja2 = pytest.importorskip("jinja2")

CONVERSATIONS = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "  You are terse.  "}, {"role": "user", "content": "Why is the sky blue?"}],
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
     {"role": "user", "content": "  and 3+3?\n"}],
    [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "a"},
     {"role": "assistant", "content": "<|channel>thought\nhmm<channel|>b"}, {"role": "user", "content": "c"}],
    [{"role": "user", "content": "multi\nline\n\ntext with <b>tags</b> & ünïcode 🦙"}],
]


@pytest.fixture(scope="module")
def template(vocab_gguf):
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)   # as transformers renders chat templates
    return env.from_string(vocab_gguf.metadata["tokenizer.chat_template"])


@pytest.mark.parametrize("messages", CONVERSATIONS, ids=range(len(CONVERSATIONS)))
@pytest.mark.parametrize("thinking", [False, True])
@pytest.mark.parametrize("gen", [True, False])
def test_render_matches_template(template, messages, thinking, gen):
    kwargs = {"enable_thinking": True} if thinking else {}
    want = template.render(messages=messages, bos_token="<bos>", add_generation_prompt=gen, **kwargs)
    assert render(messages, add_generation_prompt=gen, thinking=thinking) == want


def test_conversation_state_and_prompt(template):
    c = Conversation(system="Be brief.")
    c.add_user("hello")
    c.add_assistant("hi there")
    c.add_user("bye")
    want = template.render(messages=c.all_messages(), bos_token="<bos>", add_generation_prompt=True)
    assert c.prompt() == want
    assert c.prompt().endswith("<|turn>model\n<|channel>thought\n<channel|>")
    c.edit_last_user("see you")
    assert c.messages[-1] == {"role": "user", "content": "see you"} and len(c.messages) == 3
    c2 = Conversation.from_dict(c.to_dict())
    assert c2.prompt() == c.prompt()
    assert c.pop_last()["content"] == "see you" and len(c.messages) == 2


def test_thinking_helpers():
    assert strip_thinking("<|channel>thought\nplan<channel|>Answer.") == "Answer."
    assert split_thinking("<|channel>thought\nplan it<channel|>Answer.") == ("plan it", "Answer.")
    assert split_thinking("plain") == ("", "plain")
    assert split_thinking("<|channel>thought\nstill thinking") == ("still thinking", "")
