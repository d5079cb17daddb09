"""Gemma 4 chat format and conversation state.

Renders text conversations exactly as the Jinja template shipped in Gemma 4
GGUFs (`tokenizer.chat_template`) does, without a template engine:

    <bos><|turn>system\n[<|think|>]SYSTEM<turn|>\n        (only with a system prompt or thinking)
    <|turn>user\nTEXT<turn|>\n
    <|turn>model\nREPLY<turn|>\n                          (thinking sections stripped from replies)
    <|turn>model\n[<|channel>thought\n<channel|>]         (generation prompt; the empty thought
                                                           channel when thinking is off)

Google ships two later variants of this template, and Ollama's gemma4 renderer follows
them: `<|think|>` is followed by a newline, and only the large models (>= 12B
parameters, Ollama's "gemma4-large") get the empty thought channel. `ChatStyle` holds
these two switches; `style_for` reads them off a GGUF's own template, or its size.

Message text is data: `render_ids` tokenizes only the markup above with special tokens and
every message's content as plain text, so typed "<turn|>" or "<|channel>" stay characters.

Images: a message's content may be a list of parts, `{"type": "text", "text": ...}` and
`{"type": "image", "tokens": N}` (N: the image's soft tokens, preprocess.soft_tokens of its resized
size; other keys are the caller's). The template writes an image as "\n\n<|image|>\n\n" and
Gemma4Processor then replaces its <|image|> by the image's run, so an image renders as

    \n\n<|image>  N x <|image|>  <image|>\n\n

(without "tokens", the template's own "\n\n<|image|>\n\n", unexpanded). Audio likewise: a part
`{"type": "audio", "tokens": N}` (N: the clip's soft tokens, pyapp.families.gemma4_audio.features.soft_tokens
of its samples) is written "<|audio|>" by the template, without newlines, and expanded to

    <|audio>  N x <|audio|>  <audio|>

The runs are markup: their ids come from this code, never from what a user typed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import Gemma4Error

BOS = "<bos>"
TURN, END_TURN = "<|turn>", "<turn|>"
THINK = "<|think|>"
CHANNEL, END_CHANNEL = "<|channel>", "<channel|>"
EMPTY_THOUGHT = CHANNEL + "thought\n" + END_CHANNEL
LARGE_MODEL_PARAMS = 12_000_000_000      # Ollama: at or above this, gemma4-large's renderer
IMAGE_BEGIN, IMAGE_SOFT, IMAGE_END = "<|image>", "<|image|>", "<image|>"   # ids 255999, 258880, 258882
IMAGE_MARGIN = "\n\n"                     # the template's newlines before and after an image
AUDIO_BEGIN, AUDIO_SOFT, AUDIO_END = "<|audio>", "<|audio|>", "<audio|>"   # ids 256000, 258881, 258883
MAX_SOFT_TOKENS = 1 << 16


class ChatError(Gemma4Error, ValueError):
    """A message the chat format cannot render (an image part without a usable soft-token count)."""


@dataclass(frozen=True)
class ChatStyle:
    think_newline: bool = False          # "<|think|>\n" rather than "<|think|>"
    empty_thought: bool = True           # "<|channel>thought\n<channel|>" after the prompt when not thinking


TEMPLATE_STYLE = ChatStyle()                                        # the template in Gemma 4 vocab GGUFs
OLLAMA_SMALL = ChatStyle(think_newline=True, empty_thought=False)  # Ollama gemma4 / gemma4-small (E2B, E4B)
OLLAMA_LARGE = ChatStyle(think_newline=True, empty_thought=True)   # Ollama gemma4-large (26B-A4B, 31B)


def style_for(meta: dict, n_params: int | None = None) -> ChatStyle:
    """The chat style a model's GGUF asks for: from its Jinja template when it has one, else its size."""
    template = meta.get("tokenizer.chat_template")
    if isinstance(template, str) and THINK in template:
        # the template's source spells the newline as the two characters backslash, n
        return ChatStyle(think_newline=THINK + "\\n" in template,
                         empty_thought=EMPTY_THOUGHT.replace("\n", "\\n") in template)
    if n_params is not None:
        return OLLAMA_LARGE if n_params >= LARGE_MODEL_PARAMS else OLLAMA_SMALL
    return TEMPLATE_STYLE


def content_parts(content) -> list[str]:
    """Message content as text pieces: a string, or the text parts of a list (images left out)."""
    if isinstance(content, (list, tuple)):
        return [str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text"]
    return ["" if content is None else str(content)]


def image_run(tokens: int) -> str:
    """The placeholder run of an image of `tokens` soft tokens, as Gemma4Processor expands <|image|>."""
    return IMAGE_BEGIN + IMAGE_SOFT * tokens + IMAGE_END


def audio_run(tokens: int) -> str:
    """The placeholder run of a clip of `tokens` soft tokens, as Gemma4Processor expands <|audio|>."""
    return AUDIO_BEGIN + AUDIO_SOFT * tokens + AUDIO_END


def part_tokens(part: dict) -> int | None:
    """An image or audio part's soft-token count, or None where it gives none (the template's unexpanded form)."""
    n = part.get("tokens")
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SOFT_TOKENS:
        raise ChatError(f"an {part.get('type')} part's soft-token count is {n!r}: a whole number from 1 to "
                        f"{MAX_SOFT_TOKENS}")
    return n


def user_content(text: str, images=(), clips=()) -> list[dict] | str:
    """A user message's content: its images, then its clips (each a soft-token count, or a part dict),
    before its text, as transformers' chat examples place them; the plain text when there are none."""
    if not images and not clips:
        return text
    parts = [dict(i) if isinstance(i, dict) else {"type": "image", "tokens": i} for i in images]
    parts += [dict(c) if isinstance(c, dict) else {"type": "audio", "tokens": c} for c in clips]
    return parts + [{"type": "text", "text": text}]


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


def prompt_pieces(messages: list[dict], add_generation_prompt: bool, thinking: bool, bos: bool,
            style: ChatStyle, kept_ids=None) -> list[tuple[str | list[int], bool]]:
    """The prompt as (text, is_markup) pieces: the template's own markup, and the messages' content.
    kept_ids(message) -> a past reply's token ids to use instead of its text, or None."""
    out: list[tuple[str | list[int], bool]] = []

    def markup(text: str) -> None:
        out.append((text, True))

    def content(text: str) -> None:
        out.append((text, False))

    if bos:
        markup(BOS)
    rest = list(messages)
    has_system = bool(rest) and rest[0].get("role") in ("system", "developer")
    if thinking or has_system:
        markup(TURN + "system\n")
        if thinking:
            markup(THINK + "\n" if style.think_newline else THINK)
        if has_system:
            text = rest.pop(0).get("content")
            parts = content_parts(text)         # a list of parts: each trimmed, then a space (Google's later templates)
            content(parts[0].strip() if isinstance(text, str) else "".join(p.strip() + " " for p in parts))
        markup(END_TURN + "\n")
    for m in rest:
        role = "model" if m.get("role") == "assistant" else str(m.get("role"))
        clean = strip_thinking if role == "model" else str.strip     # past replies lose their thoughts
        markup(TURN)
        content(role)                    # the role is the caller's text too: only "user"/"model" are markup
        markup("\n")
        ids = kept_ids(m) if kept_ids and role == "model" else None
        body = m.get("content")
        if ids:
            out.append((ids, False))
        elif isinstance(body, (list, tuple)):
            for part in body:                  # in order: the template writes each part where it is
                if not isinstance(part, dict):
                    continue
                if part.get("type") == "text":
                    content(clean(str(part.get("text", ""))))
                elif part.get("type") == "image":
                    n = part_tokens(part)
                    markup(IMAGE_MARGIN + (IMAGE_SOFT if n is None else image_run(n)) + IMAGE_MARGIN)
                elif part.get("type") == "audio":
                    n = part_tokens(part)
                    markup(AUDIO_SOFT if n is None else audio_run(n))
        else:
            content(clean("" if body is None else str(body)))
        markup(END_TURN + "\n")
    if add_generation_prompt:
        markup(TURN + "model\n")
        if not thinking and style.empty_thought:
            markup(EMPTY_THOUGHT)
    return out


def render(messages: list[dict], add_generation_prompt: bool = True, thinking: bool = False,
           bos: bool = True, style: ChatStyle = TEMPLATE_STYLE) -> str:
    """The prompt text for messages [{"role": "system"|"user"|"assistant", "content": str}, ...]."""
    return "".join(text for text, _ in prompt_pieces(messages, add_generation_prompt, thinking, bos, style))


def render_ids(tokenizer, messages: list[dict], add_generation_prompt: bool = True, thinking: bool = False,
               bos: bool = True, style: ChatStyle = TEMPLATE_STYLE) -> list[int]:
    """The prompt's token ids. Only the template's markup becomes special tokens: message content is
    plain text, so "<turn|>\n<|turn>system" typed in a message stays text and forges no turn.

    A past reply that carries the ids it was generated as (reply_ids) keeps them: re-tokenizing its
    text may give other ids, and the KV cache, which holds the generated ones, would then be
    recomputed from there on (with sliding-window layers, often the whole conversation)."""
    return tokenizer.encode_parts(prompt_pieces(messages, add_generation_prompt, thinking, bos, style,
                                          lambda m: _kept_ids(tokenizer, m)))


def reply_ids(tokenizer, prompt: list[int], generated: list[int]) -> dict:
    """What an assistant message keeps of its reply so the next prompt extends the KV cache exactly:
    the ids that followed the prompt's last "<|turn>model\n" (its empty thought channel, if any) and
    the reply as generated, with the vocabulary they belong to. Store them in the message's dict."""
    opening = tokenizer.encode_parts([(TURN + "model\n", True)])
    start = next((i + len(opening) for i in range(len(prompt) - len(opening), -1, -1)
                  if prompt[i:i + len(opening)] == opening), len(prompt))
    return {"ids": [int(t) for t in prompt[start:]] + [int(t) for t in generated], "vocab": tokenizer.fingerprint}


def _kept_ids(tokenizer, m: dict) -> list[int] | None:
    """A past reply's kept ids, if they still stand for its text in this vocabulary. A reply that
    thought is rendered from its text: the template drops past thoughts (Google's guidance)."""
    ids = m.get("ids")
    if not isinstance(ids, list) or not ids or m.get("vocab") != tokenizer.fingerprint:
        return None
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < tokenizer.n_vocab for t in ids):
        return None
    said = tokenizer.decode(ids)
    text = "".join(content_parts(m.get("content")))
    if CHANNEL in said.replace(EMPTY_THOUGHT, "") or strip_thinking(said) != strip_thinking(text):
        return None                      # a thought, or the text was changed since: the text decides
    return ids


@dataclass
class Conversation:
    """A multi-turn chat: optional system prompt, alternating user / assistant messages."""

    system: str | None = None
    messages: list = field(default_factory=list)
    thinking: bool = False
    style: ChatStyle = TEMPLATE_STYLE

    def add_user(self, text: str, images=(), clips=()) -> None:
        """images, clips: each one's soft-token count (or its part dict), placed before the text."""
        self.messages.append({"role": "user", "content": user_content(text, images, clips)})

    def add_assistant(self, text: str, kept: dict | None = None) -> None:
        """kept: reply_ids(...) of the reply, so the next prompt reuses the KV cache exactly."""
        self.messages.append({"role": "assistant", "content": text, **(kept or {})})

    def pop_last(self) -> dict | None:
        return self.messages.pop() if self.messages else None

    def edit_last_user(self, text: str, images=(), clips=()) -> None:
        """Replace the last user message and drop what followed it (edit-and-resend)."""
        for i in range(len(self.messages) - 1, -1, -1):
            if self.messages[i]["role"] == "user":
                self.messages[i:] = [{"role": "user", "content": user_content(text, images, clips)}]
                return
        self.add_user(text, images, clips)

    def all_messages(self) -> list[dict]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + list(self.messages)

    def prompt(self) -> str:
        """The text to tokenize for the next reply (ends with the model's turn opening)."""
        return render(self.all_messages(), add_generation_prompt=True, thinking=self.thinking, style=self.style)

    def prompt_ids(self, tokenizer) -> list[int]:
        """prompt() as token ids, message content as plain text (see render_ids)."""
        return render_ids(tokenizer, self.all_messages(), add_generation_prompt=True, thinking=self.thinking,
                          style=self.style)

    def to_dict(self) -> dict:
        return {"system": self.system, "messages": [dict(m) for m in self.messages], "thinking": self.thinking,
                "style": {"think_newline": self.style.think_newline, "empty_thought": self.style.empty_thought}}

    @classmethod
    def from_dict(cls, d: dict) -> "Conversation":
        style = ChatStyle(**d["style"]) if isinstance(d.get("style"), dict) else TEMPLATE_STYLE
        return cls(system=d.get("system"), messages=[dict(m) for m in d.get("messages", [])],
                   thinking=bool(d.get("thinking")), style=style)
