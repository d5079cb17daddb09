"""Gemma 4 chat format and conversation state.

Renders text conversations exactly as the Jinja template shipped in Gemma 4
GGUFs (`tokenizer.chat_template`) does, without a template engine:

    <bos><|turn>system\n[<|think|>]SYSTEM<turn|>\n        (only with a system prompt or thinking)
    <|turn>user\nTEXT<turn|>\n
    <|turn>model\nREPLY<turn|>\n                          (thinking sections stripped from replies)
    <|turn>model\n[<|channel>thought\n<channel|>]         (generation prompt; the empty thought
                                                           channel when thinking is off)
"""

from __future__ import annotations

from dataclasses import dataclass, field

BOS = "<bos>"
TURN, END_TURN = "<|turn>", "<turn|>"
THINK = "<|think|>"
CHANNEL, END_CHANNEL = "<|channel>", "<channel|>"
EMPTY_THOUGHT = CHANNEL + "thought\n" + END_CHANNEL
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "model", "model": "model"}


def strip_thinking(text: str) -> str:
    """A reply without its <|channel>...<channel|> sections (what the template keeps of past replies)."""
    out = []
    for part in text.split(END_CHANNEL):
        out.append(part.split(CHANNEL)[0] if CHANNEL in part else part)
    return "".join(out).strip()


def split_thinking(text: str) -> tuple[str, str]:
    """(thought, answer) of a generated reply: the thought channel, if any, and the rest."""
    if CHANNEL not in text:
        return "", text
    before, _, rest = text.partition(CHANNEL)
    thought, closed, after = rest.partition(END_CHANNEL)
    if thought.startswith("thought"):
        thought = thought[len("thought"):].lstrip("\n")
    return thought.strip(), (before + after).strip() if closed else before.strip()


def render(messages: list[dict], add_generation_prompt: bool = True, thinking: bool = False,
           bos: bool = True) -> str:
    """The prompt text for messages [{"role": "system"|"user"|"assistant", "content": str}, ...]."""
    out = [BOS] if bos else []
    rest = list(messages)
    has_system = bool(rest) and rest[0].get("role") in ("system", "developer")
    if thinking or has_system:
        out.append(TURN + "system\n")
        if thinking:
            out.append(THINK)
        if has_system:
            out.append(str(rest.pop(0).get("content", "")).strip())
        out.append(END_TURN + "\n")
    for m in rest:
        role = ROLES.get(m.get("role"), m.get("role"))
        content = str(m.get("content", ""))
        out.append(f"{TURN}{role}\n{strip_thinking(content) if role == 'model' else content.strip()}{END_TURN}\n")
    if add_generation_prompt:
        out.append(TURN + "model\n")
        if not thinking:
            out.append(EMPTY_THOUGHT)
    return "".join(out)


@dataclass
class Conversation:
    """A multi-turn chat: optional system prompt, alternating user / assistant messages."""

    system: str | None = None
    messages: list = field(default_factory=list)
    thinking: bool = False

    def add_user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})

    def add_assistant(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})

    def pop_last(self) -> dict | None:
        return self.messages.pop() if self.messages else None

    def edit_last_user(self, text: str) -> None:
        """Replace the last user message and drop what followed it (edit-and-resend)."""
        for i in range(len(self.messages) - 1, -1, -1):
            if self.messages[i]["role"] == "user":
                self.messages[i:] = [{"role": "user", "content": text}]
                return
        self.add_user(text)

    def all_messages(self) -> list[dict]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + list(self.messages)

    def prompt(self) -> str:
        """The text to tokenize for the next reply (ends with the model's turn opening)."""
        return render(self.all_messages(), add_generation_prompt=True, thinking=self.thinking)

    def to_dict(self) -> dict:
        return {"system": self.system, "messages": list(self.messages), "thinking": self.thinking}

    @classmethod
    def from_dict(cls, d: dict) -> "Conversation":
        return cls(system=d.get("system"), messages=list(d.get("messages", [])), thinking=bool(d.get("thinking")))
