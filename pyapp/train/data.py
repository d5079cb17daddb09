"""Training data for LoRA fine-tuning: files -> token ids, loss masks and fixed-length sequences.

Two formats (chosen by the file name, else by the first character: '{' means JSONL):

- JSONL chats, one example a line: {"messages": [{"role": "system"|"user"|"assistant", "content": ...}]}
  (content a string, or a list of {"type": "text", "text": ...} parts, as chat.py takes it). A line
  {"text": "..."} is a plain-text example. Blank lines are skipped.
- Plain text (.txt, .md, anything not JSONL): one example per paragraph, paragraphs separated by
  blank lines; the newlines inside a paragraph are kept.

Tokens are what the model sees in chat (pyapp.chat): a chat is rendered turn by turn exactly as
chat.py renders the generation prompt for each assistant turn, with the model's ChatStyle (the
empty thought channel after "<|turn>model\\n" where the style has one), and each past reply kept
as its ids as the chat keeps them (chat.reply_ids). Message text is plain data: typed markup never
becomes control tokens. Plain text is <bos> + the paragraph as plain text (no end token).

Loss mask (pyapp/reference/backward.py's convention: mask[i] = 1 makes token i a target, predicted
from position i - 1; mask[0] is never counted): chats count only the assistant tokens, each
reply's text and its end-of-turn token; plain text counts every token.

Sequences: one example per sequence, cut to seq_len (a warning count; an example left without a
target is dropped) and padded to seq_len with mask 0 (`Sequence.padded`). Several examples are not
packed into one sequence: that needs an attention reset per segment, which the GPU backward does
not have yet. A seeded held-out split (val_fraction of the examples, at least one when there are
two or more) gives the validation loss.

    ds = load_dataset(text, "chats.jsonl", tokenizer, seq_len=256, style=style_for(gguf.metadata, n))
    ds.train, ds.val            # [Sequence]: .ids, .mask (unpadded), .padded(seq_len, pad_id)
    ds.stats.as_dict()          # counts for the app: examples, tokens, targets, cut, dropped
    order = epoch_order(len(ds.train), seed, epoch)

Checked where it enters, the same for the CLI's --data and the page's file (issue 25): at most
MAX_DATA_BYTES; each example (a JSONL line, a paragraph) at most MAX_EXAMPLE_CHARS characters; JSON
nested at most MAX_DEPTH deep, integers of at most MAX_INT_DIGITS digits, no NaN or Infinity; every
message's content text: a non-empty string, or text parts only (this app trains on text: an image
or audio part is refused, not dropped). Anything else is a DataError naming the file and line.

Standard library only (runs in Pyodide).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import asdict, dataclass, field

from ..chat import END_TURN, TEMPLATE_STYLE, ChatStyle, content_parts, prompt_pieces, reply_ids, strip_thinking
from ..errors import Gemma4Error

ROLES = ("system", "user", "assistant")
CHAT_EXTENSIONS = (".jsonl", ".json", ".ndjson")
TEXT_EXTENSIONS = (".txt", ".text", ".md")
DEFAULT_VAL_FRACTION = 0.1
MAX_DATA_BYTES = 64 << 20         # tokens held as Python lists: a few hundred MB of heap past this
MAX_EXAMPLE_CHARS = 1 << 20       # one example; training sees only its first seq_len (<= 32768) tokens
MAX_DEPTH = 64                    # JSON nesting: a chat line needs 4 ({messages: [{content: [{...}]}]})
MAX_INT_DIGITS = 100              # a JSON integer (Python refuses past 4300 digits, in its own words)


class DataError(Gemma4Error, ValueError):
    """The training file cannot be used; the message names the file and line."""


@dataclass
class Example:
    """One example as tokens: ids (BOS first) and the loss mask, one entry per id."""
    ids: list
    mask: list
    line: int                 # where it starts in the file (1-based)


@dataclass
class Sequence:
    """One training sequence: an example, cut to seq_len; `padded` gives the fixed-length form."""
    ids: list
    mask: list
    line: int

    @property
    def n_targets(self) -> int:
        return sum(self.mask[1:])

    def padded(self, seq_len: int, pad_id: int = 0) -> tuple[list, list]:
        """ids and mask of exactly seq_len tokens: padding has mask 0 and, coming after every real
        token, changes nothing before it under causal attention."""
        n = seq_len - len(self.ids)
        if n < 0:
            raise ValueError(f"sequence of {len(self.ids)} tokens is longer than seq_len {seq_len}")
        return self.ids + [pad_id] * n, self.mask + [0] * n


@dataclass
class DataStats:
    """What the app shows before training starts."""
    format: str               # "chat" or "text"
    n_examples: int           # examples read from the file
    n_train: int              # training sequences (after dropping)
    n_val: int                # held-out sequences
    train_tokens: int         # real (unpadded) tokens in the training sequences
    train_targets: int        # tokens the training loss counts
    val_tokens: int
    val_targets: int
    n_cut: int                # examples longer than seq_len, cut to it
    n_dropped: int            # examples with no target left after the cut
    longest: int              # tokens of the longest example before cutting
    seq_len: int

    def as_dict(self) -> dict:
        return asdict(self)

    def warnings(self) -> list[str]:
        out = []
        if self.n_cut:
            out.append(f"{self.n_cut} example(s) longer than seq_len {self.seq_len} (longest {self.longest} "
                       "tokens) were cut to it")
        if self.n_dropped:
            out.append(f"{self.n_dropped} example(s) had no assistant token left after the cut and were dropped")
        if not self.n_val:
            out.append("no held-out examples: no validation loss")
        return out


@dataclass
class Dataset:
    train: list
    val: list
    stats: DataStats
    pad_id: int = 0
    warnings: list = field(default_factory=list)


# ---- reading --------------------------------------------------------------------------------------

def detect_format(text: str, name: str = "") -> str:
    """"chat" for JSONL, "text" for plain text: by extension, else by the first non-blank character."""
    low = name.lower()
    if low.endswith(CHAT_EXTENSIONS):
        return "chat"
    if low.endswith(TEXT_EXTENSIONS):
        return "text"
    return "chat" if text.lstrip()[:1] == "{" else "text"


def decode_text(data, name: str = "data") -> str:
    """A file's bytes as text (UTF-8, a leading byte-order mark dropped)."""
    if isinstance(data, str):
        return data.lstrip("\ufeff")
    try:
        return bytes(data).decode("utf-8").lstrip("\ufeff")
    except UnicodeDecodeError as e:
        line = bytes(data)[:e.start].count(b"\n") + 1
        raise DataError(f"{name} line {line}: not UTF-8 text (byte {e.start})") from None


def read_paragraphs(text: str) -> list[tuple[int, str]]:
    """(first line, paragraph) for each blank-line-separated paragraph with any non-blank text."""
    out, lines, start = [], [], 0
    for n, line in enumerate(text.splitlines() + [""], 1):
        if line.strip():
            if not lines:
                start = n
            lines.append(line)
        elif lines:
            out.append((start, "\n".join(lines).strip()))
            lines = []
    return out


def _check_size(text: str, where: str, what: str) -> None:
    if len(text) > MAX_EXAMPLE_CHARS:
        raise DataError(f"{where}: {what} of {len(text):,} characters; an example may have at most "
                        f"{MAX_EXAMPLE_CHARS:,} (training uses only its first seq_len tokens): split it into "
                        "several examples")


class _Refused(ValueError):
    """A JSON value parsed but refused (a huge integer, NaN): its message goes to the user as it is."""


def _json_int(s: str) -> int:
    if len(s.lstrip("-")) > MAX_INT_DIGITS:
        raise _Refused(f"an integer of {len(s.lstrip('-')):,} digits (at most {MAX_INT_DIGITS} are read)")
    return int(s)


def _json_float(s: str) -> float:
    if len(s) > MAX_INT_DIGITS * 2:
        raise _Refused(f"a number written with {len(s):,} characters (at most {MAX_INT_DIGITS * 2} are read)")
    v = float(s)
    if v in (float("inf"), float("-inf")):
        raise _Refused(f"the number {s[:40]} is beyond a float's range")
    return v


def _json_constant(s: str):
    raise _Refused(f"{s} is not a JSON number (JSON has no NaN or Infinity)")


_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_BRACKET = re.compile(r"[\[\]{}]")


def _too_deep(line: str) -> bool:
    """Whether the line's arrays and objects nest more than MAX_DEPTH deep (brackets inside strings do not
    count): json.loads recurses once per level, and deep enough it runs out of stack (RecursionError; in the
    browser, possibly worse), so such a line is refused before it is parsed."""
    if line.count("[") + line.count("{") <= MAX_DEPTH:
        return False
    depth = 0
    for ch in _BRACKET.findall(_JSON_STRING.sub("", line)):
        depth += 1 if ch in "[{" else -1
        if depth > MAX_DEPTH:
            return True
    return False


def parse_json_line(line: str, where: str):
    """One JSONL line's value, or a DataError saying what is wrong with it."""
    if _too_deep(line):
        raise DataError(f"{where}: JSON nested more than {MAX_DEPTH} levels deep (a chat line needs 4)")
    try:
        return json.loads(line, parse_int=_json_int, parse_float=_json_float, parse_constant=_json_constant)
    except json.JSONDecodeError as e:
        raise DataError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
    except _Refused as e:
        raise DataError(f"{where}: {e}") from None
    except RecursionError:
        raise DataError(f"{where}: JSON nested too deeply (a chat line needs 4 levels)") from None


def read_jsonl(text: str, name: str = "data") -> list[tuple[int, object]]:
    """(line, messages list or plain-text str) for each non-blank line, checked; DataError otherwise."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{name} line {n}"
        _check_size(line, where, "a line")
        obj = parse_json_line(line, where)
        if not isinstance(obj, dict):
            raise DataError(f"{where}: expected an object like {{\"messages\": [...]}}, got {type(obj).__name__}")
        if "messages" in obj:
            out.append((n, _checked_messages(obj["messages"], where)))
        elif isinstance(obj.get("text"), str):
            if not obj["text"].strip():
                raise DataError(f"{where}: \"text\" is empty: give the example's text, or remove the line")
            out.append((n, obj["text"]))
        else:
            raise DataError(f"{where}: no \"messages\" list (or \"text\" string); keys are {sorted(obj)[:5]}")
    return out


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _checked_messages(messages, where: str) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise DataError(f"{where}: \"messages\" must be a non-empty list of {{\"role\", \"content\"}} objects")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise DataError(f"{where}: message {i + 1} is not an object")
        role = m.get("role")
        if role not in ROLES:
            hint = " (use \"assistant\" for the model's replies)" if role == "model" else ""
            raise DataError(f"{where}: message {i + 1} has role {_short(role)}; roles are "
                            f"{', '.join(ROLES)}{hint}")
        content = m.get("content")
        if not (isinstance(content, str) or (isinstance(content, list) and all(isinstance(p, dict)
                                                                                for p in content))):
            raise DataError(f"{where}: message {i + 1} ({role}) has no text content: \"content\" must be a "
                            "string or a list of {\"type\": \"text\", \"text\": ...} parts")
        if isinstance(content, list):
            for j, p in enumerate(content):
                if p.get("type") != "text":
                    raise DataError(f"{where}: message {i + 1} ({role}), part {j + 1} is of type "
                                    f"{str(p.get('type'))[:40]!r}: fine-tuning here trains on text only (remove "
                                    "image and audio parts, or the example)")
                if not isinstance(p.get("text"), str):
                    raise DataError(f"{where}: message {i + 1} ({role}), part {j + 1} has no text: a text part is "
                                    "{\"type\": \"text\", \"text\": \"...\"} with a string")
        text = "".join(content_parts(content))
        if not (strip_thinking(text) if role == "assistant" else text).strip():
            raise DataError(f"{where}: message {i + 1} ({role}) is empty: give it text, or remove it"
                            + (" (a reply of only a thought channel trains nothing)" if role == "assistant"
                               and text.strip() else ""))
    if not any(m["role"] == "assistant" for m in messages):
        raise DataError(f"{where}: no assistant turn: a chat example trains on the assistant's replies")
    return messages


# ---- tokenizing -----------------------------------------------------------------------------------

def tokenize_chat(tokenizer, messages: list[dict], style: ChatStyle = TEMPLATE_STYLE,
                  thinking: bool = False) -> tuple[list, list]:
    """ids and mask of a chat: each assistant turn's prompt exactly as chat.render_ids makes it for
    generation, past replies kept as the ids they were generated as (chat.reply_ids: the empty thought
    channel, if the style has one, and the reply), then the reply and <turn|>, the targets. Messages
    after the last assistant turn train nothing and are left out.

    The kept ids are used as they are; the chat first checks that they decode to the reply's text
    (chat._kept_ids), which holds for real vocabularies but not for every text in a reduced one."""
    end_turn = tokenizer.ids[END_TURN]
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    ids: list = []
    mask: list = []
    history: list = []
    for m in messages[:last + 1]:
        if m["role"] != "assistant":
            history.append({"role": m["role"], "content": m["content"]})
            continue
        prompt = tokenizer.encode_parts(prompt_pieces(history, True, thinking, True, style, lambda h: h.get("ids")))
        assert prompt[:len(ids)] == ids, "each prompt extends the previous turns"
        text = "".join(strip_thinking(p) for p in content_parts(m["content"]))
        reply = tokenizer.encode_parts([(text, False)])
        mask += [0] * (len(prompt) - len(ids)) + [1] * (len(reply) + 1)
        ids = prompt + reply + [end_turn]
        history.append({"role": "assistant", "content": text, **reply_ids(tokenizer, prompt, reply)})
    return ids, mask


def tokenize_text(tokenizer, text: str) -> tuple[list, list]:
    """<bos> and the text as plain text (no special tokens cut out of it); every token a target."""
    ids = [tokenizer.bos_id] + tokenizer.encode_parts([(text, False)])
    return ids, [1] * len(ids)


def read_examples(data, name: str, tokenizer, style: ChatStyle = TEMPLATE_STYLE, fmt: str = "auto",
                  thinking: bool = False) -> tuple[str, list[Example]]:
    """(format, [Example]) of a training file's bytes or text."""
    if len(data) > MAX_DATA_BYTES:
        raise DataError(f"{name} is {len(data) / 2**20:,.0f} MiB: training files are at most {MAX_DATA_BYTES >> 20} MiB")
    text = decode_text(data, name)
    if not text.strip():
        raise DataError(f"{name} is empty: no training examples")
    fmt = detect_format(text, name) if fmt == "auto" else fmt
    if fmt not in ("chat", "text"):
        raise ValueError(f"format {fmt!r}: expected 'chat', 'text' or 'auto'")
    items = read_jsonl(text, name) if fmt == "chat" else read_paragraphs(text)
    if fmt == "text":
        for line, paragraph in items:
            _check_size(paragraph, f"{name} line {line}", "a paragraph")
    if not items:
        raise DataError(f"{name} has no training examples")
    out = []
    for line, item in items:
        if isinstance(item, str):
            ids, mask = tokenize_text(tokenizer, item)
        else:
            try:
                ids, mask = tokenize_chat(tokenizer, item, style, thinking)
            except DataError as e:
                raise DataError(f"{name} line {line}: {e}") from None
        out.append(Example(ids, mask, line))
    return fmt, out


# ---- splitting and cutting ------------------------------------------------------------------------

def split_indices(n: int, val_fraction: float, seed: int) -> tuple[list, list]:
    """(train, val) example indices, both in file order: a seeded choice of round(n * val_fraction)
    held-out examples, at least 1 when val_fraction > 0 and n >= 2, never all of them."""
    if not 0 <= val_fraction < 1:
        raise ValueError(f"val_fraction {val_fraction} must be in [0, 1)")
    n_val = 0 if val_fraction == 0 or n < 2 else min(n - 1, max(1, round(n * val_fraction)))
    held = set(random.Random(seed).sample(range(n), n_val))
    return [i for i in range(n) if i not in held], sorted(held)


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The training sequences' order in an epoch: a shuffle fixed by (seed, epoch), so a resumed run
    sees the same order."""
    order = list(range(n))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


def build_dataset(fmt: str, examples: list[Example], seq_len: int, val_fraction: float = DEFAULT_VAL_FRACTION,
                  seed: int = 0, pad_id: int = 0) -> Dataset:
    """Split, cut to seq_len and count."""
    if seq_len < 2:
        raise ValueError(f"seq_len {seq_len} must be at least 2")
    train_idx, val_idx = split_indices(len(examples), val_fraction, seed)
    n_cut = n_dropped = 0

    def sequences(indices):
        nonlocal n_cut, n_dropped
        out = []
        for i in indices:
            ex = examples[i]
            if len(ex.ids) > seq_len:
                n_cut += 1
            s = Sequence(ex.ids[:seq_len], ex.mask[:seq_len], ex.line)
            if s.n_targets == 0:
                n_dropped += 1
                continue
            out.append(s)
        return out

    train, val = sequences(train_idx), sequences(val_idx)
    if not train:
        raise DataError(f"no training example keeps a target within seq_len {seq_len}: raise --seq-len "
                        f"(the longest example has {max(len(e.ids) for e in examples)} tokens)")
    stats = DataStats(fmt, len(examples), len(train), len(val),
                      sum(len(s.ids) for s in train), sum(s.n_targets for s in train),
                      sum(len(s.ids) for s in val), sum(s.n_targets for s in val),
                      n_cut, n_dropped, max(len(e.ids) for e in examples), seq_len)
    return Dataset(train, val, stats, pad_id, stats.warnings())


def load_dataset(data, name: str, tokenizer, seq_len: int, style: ChatStyle = TEMPLATE_STYLE,
                 val_fraction: float = DEFAULT_VAL_FRACTION, seed: int = 0, fmt: str = "auto",
                 thinking: bool = False) -> Dataset:
    """A training file (bytes or text; `name` picks the format and labels errors) as a Dataset."""
    fmt, examples = read_examples(data, name, tokenizer, style, fmt, thinking)
    pad_id = tokenizer.ids.get("<pad>", 0)
    return build_dataset(fmt, examples, seq_len, val_fraction, seed, pad_id)
