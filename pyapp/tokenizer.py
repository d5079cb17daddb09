"""Gemma 4 tokenizer from GGUF metadata, as llama.cpp runs tokenizer.ggml.model == "gemma4".

SentencePiece-style BPE (llama.cpp src/llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_GEMMA4):
  1. special tokens: user-defined ones (<|channel>, <|"|>, ...) are always cut out of
     the text; control ones (<bos>, <|turn>, ...) only when parse_special is on.
     Longer tokens are cut first, as llama.cpp's tokenizer_st_partition does.
     End-of-generation tokens count as control, as llama.cpp makes them. encode_parts
     cuts none out of the parts it is told are plain text (chat messages).
  2. spaces become U+2581 (no space prefix is added).
  3. the text is split into runs of newlines and runs of anything else; a run of
     newlines that is itself a token stays whole.
  4. each run is merged by BPE rank (lowest rank first, leftmost on ties), starting
     from single characters; a final piece not in the vocabulary falls back to its
     UTF-8 bytes as <0xXX> tokens.
Decoding maps U+2581 back to spaces, byte tokens to their byte and drops control tokens and
the <unusedN> placeholders (Gemma GGUFs type them NORMAL; they never come out of encoding text).

Two converters write this vocabulary, with the same tokens and merges but other labels
(README, "Supported files"): llama.cpp's (`tokenizer.ggml.model = "gemma4"`) and Ollama's
(`"llama"` with `tokenizer.ggml.pre = "gemma4"`; every token tokenizer.json flags special
typed CONTROL, the <0xXX> byte tokens NORMAL). `canonical_types` gives both llama.cpp's
typing, so channels and tool calls parse and byte fallback decodes whichever wrote the file.
"""

from __future__ import annotations

import hashlib
import heapq
import re

from .errors import Gemma4Error

SPACE = "\u2581"
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
_RUNS = re.compile(r"[^\n]+|\n+")
_SURROGATE = re.compile("[\ud800-\udfff]")
_UNUSED = re.compile(r"<unused\d+>")
_CACHE_CHARS = 1 << 22         # characters of runs remembered (repeated prompts re-encode fast; memory bounded)
# Tokens that end generation, found by their text as llama.cpp does (its EOG list, the
# entries a Gemma vocabulary can hold). llama.cpp also marks them CONTROL, so a
# user-defined one such as <|tool_response> is hidden in decoding and is not cut out of
# text when parse_special is off.
_END_OF_GENERATION = ("<eos>", "<turn|>", "<|tool_response>", "<end_of_turn>")
# Markup that must come out of decoding so the chat parser can read it: llama.cpp's converter types
# these USER_DEFINED (convert_hf_to_gguf's Gemma4Model.set_vocab); Ollama's types them CONTROL.
_VISIBLE = ("<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>",
            '<|"|>')
_BYTE_TOKEN = re.compile(r"<0x[0-9A-F]{2}>")
# (tokenizer.ggml.model, tokenizer.ggml.pre) of the files that hold a Gemma 4 vocabulary
_MODELS = {("gemma4", None), ("gemma4", "gemma4"), ("llama", "gemma4")}


class TokenizerError(Gemma4Error, ValueError):
    """The GGUF's tokenizer metadata is missing or not a Gemma 4 tokenizer."""


class Tokenizer:
    def __init__(self, tokens: list[str], types: list[int], merges: list[str], bos_id: int, eos_id: int,
                 extra_stops=()):
        self.tokens = tokens
        self.n_vocab = len(tokens)
        self.bos_id, self.eos_id = bos_id, eos_id
        self.add_bos = True               # llama.cpp forces add_bos on for gemma4 whatever the file says
        self.ids = {t: i for i, t in enumerate(tokens)}
        self.ranks = _merge_ranks(merges)
        self._byte_ids = [self.ids.get(f"<0x{b:02X}>") for b in range(256)]
        eog = [self.ids[t] for t in _END_OF_GENERATION if t in self.ids]
        self.types = types = canonical_types(tokens, types, eog)
        specials = [i for i, ty in enumerate(types) if ty in (CONTROL, USER_DEFINED, UNKNOWN)]
        specials.sort(key=lambda i: -len(tokens[i].encode("utf-8")))      # longest (in bytes) cut first
        self._specials = [(tokens[i], i, types[i] == USER_DEFINED) for i in specials if tokens[i]]
        self.stop_ids = frozenset({eos_id, *extra_stops, *eog} - {None})
        self._cache: dict[str, list[int]] = {}
        self._cache_chars = 0
        self._pieces: list[bytes | None] = [None] * self.n_vocab
        self._fingerprint: str | None = None

    @classmethod
    def from_metadata(cls, meta: dict) -> "Tokenizer":
        model, pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre")
        if not isinstance(model, str) or not isinstance(pre, (str, type(None))) or (model, pre) not in _MODELS:
            shown = f"{model!r}" + (f" (pre-tokenizer {pre!r})" if pre is not None else "")
            raise TokenizerError(f"tokenizer.ggml.model is {shown[:120]}; this app reads Gemma 4 vocabularies "
                                 "('gemma4', or Ollama's 'llama' with pre-tokenizer 'gemma4')")
        try:
            tokens = meta["tokenizer.ggml.tokens"]
            types = meta.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
            merges = meta["tokenizer.ggml.merges"]
        except KeyError as e:
            raise TokenizerError(f"GGUF metadata lacks {e.args[0]}") from None
        extra = [meta[k] for k in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id") if k in meta]
        extra += list(meta.get("tokenizer.ggml.eos_token_ids") or [])       # Ollama's GGUFs may list more
        extra = [int(i) for i in extra if 0 <= int(i) < len(tokens)]
        if len(types) < len(tokens):
            raise TokenizerError(f"tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
        return cls(tokens, types, merges, int(meta.get("tokenizer.ggml.bos_token_id", 2)),
                   int(meta.get("tokenizer.ggml.eos_token_id", 1)), extra)

    # -- encoding ----------------------------------------------------------------
    def encode(self, text: str, add_bos: bool = False, parse_special: bool = True) -> list[int]:
        """Token ids of text; special-token strings become their ids (control ones only with parse_special)."""
        return self._encode(self._partition(_valid(text), parse_special), add_bos)

    def encode_parts(self, parts, add_bos: bool = False) -> list[int]:
        """Token ids of a prompt given as (text, special) parts, e.g. a chat template's markup and its messages.

        Special-token strings become their ids only in parts with special=True. Other parts are plain
        text: no special token of any type is cut out of them (unlike encode(parse_special=False),
        which still cuts user-defined ones such as <|channel>, as llama.cpp does), so a message can
        never forge a turn, a channel or a tool call. Text is merged across part boundaries before BPE,
        so text without special-token strings gets the same ids as encode("".join(texts)).
        A part may also be a list of token ids (a past reply as generated): kept as they are."""
        frags: list = []
        for text, special in parts:
            if isinstance(text, (list, tuple)):
                frags.extend(int(t) for t in text)
            else:
                frags.extend(self._partition(_valid(text), True) if special else [_valid(text)])
        return self._encode(frags, add_bos)

    @property
    def fingerprint(self) -> str:
        """A short digest of the vocabulary: token ids kept with a conversation are only reused by a
        model whose vocabulary gives them the same meaning."""
        if self._fingerprint is None:
            digest = hashlib.sha256("\n".join(self.tokens).encode("utf-8", "surrogatepass"))
            self._fingerprint = digest.hexdigest()[:16]
        return self._fingerprint

    def _encode(self, frags: list, add_bos: bool) -> list[int]:
        """Ids of text fragments (str) and special token ids (int); adjacent fragments are one text."""
        out = [self.bos_id] if add_bos else []
        pending: list[str] = []
        for frag in frags + [None]:
            if isinstance(frag, str):
                pending.append(frag)
                continue
            if pending:
                for run in _RUNS.findall("".join(pending).replace(" ", SPACE)):
                    out.extend(self._encode_run(run))
                pending = []
            if frag is not None:
                out.append(frag)
        return out

    def _partition(self, text: str, parse_special: bool) -> list:
        """Text fragments (str) and special token ids (int), longest special tokens cut first."""
        frags: list = [text]
        for piece, tid, user_defined in self._specials:
            if not (parse_special or user_defined) or piece not in text:
                continue
            nxt = []
            for f in frags:
                if isinstance(f, int) or piece not in f:
                    nxt.append(f)
                    continue
                parts = f.split(piece)
                for j, p in enumerate(parts):
                    if j:
                        nxt.append(tid)
                    if p:
                        nxt.append(p)
            frags = nxt
        return frags

    def _encode_run(self, run: str) -> list[int]:
        ids = self._cache.get(run)
        if ids is not None:
            return ids
        whole = self.ids.get(run) if run[0] == "\n" else None
        if whole is not None:
            ids = [whole]
        else:
            ids = []
            for piece in self._bpe(run):
                tid = self.ids.get(piece)
                if tid is not None:
                    ids.append(tid)
                else:
                    ids.extend(b for b in (self._byte_ids[c] for c in piece.encode("utf-8")) if b is not None)
        if self._cache_chars + len(run) <= _CACHE_CHARS:
            self._cache[run] = ids
            self._cache_chars += len(run)
        return ids

    def _bpe(self, word: str) -> list[str]:
        """Merge characters by rank: a heap of candidate pairs over a linked list of symbols."""
        sym = list(word)
        n = len(sym)
        if n == 1:
            return sym
        nxt = list(range(1, n + 1))
        prv = list(range(-1, n - 1))
        ranks = self.ranks                 # by "left right": the run has no spaces (they are ▁ by now)
        heap = []
        for i in range(n - 1):
            r = ranks.get(sym[i] + " " + sym[i + 1])
            if r is not None:
                heap.append((r, i, sym[i] + sym[i + 1]))
        heapq.heapify(heap)
        while heap:
            r, i, merged = heapq.heappop(heap)
            j = nxt[i] if i < n else n
            if sym[i] is None or j >= n or sym[i] + sym[j] != merged:
                continue                                  # stale: one side was merged since
            sym[i] = merged
            sym[j] = None
            nxt[i] = nxt[j]
            if nxt[j] < n:
                prv[nxt[j]] = i
            p = prv[i]
            if p >= 0:
                rr = ranks.get(sym[p] + " " + merged)
                if rr is not None:
                    heapq.heappush(heap, (rr, p, sym[p] + merged))
            q = nxt[i]
            if q < n:
                rr = ranks.get(merged + " " + sym[q])
                if rr is not None:
                    heapq.heappush(heap, (rr, i, merged + sym[q]))
        return [s for s in sym if s is not None]

    # -- decoding ----------------------------------------------------------------
    def token_to_piece(self, tid: int, special: bool = False) -> bytes:
        """The bytes a token stands for; control tokens are b"" unless special."""
        if not 0 <= tid < self.n_vocab:
            return b""
        ty = self.types[tid]
        if ty == CONTROL or ty == UNKNOWN:
            return self.tokens[tid].encode("utf-8") if special else b""
        cached = self._pieces[tid]
        if cached is None:
            text = self.tokens[tid]
            if ty == BYTE:
                cached = bytes([int(text[3:5], 16)])
            elif ty == USER_DEFINED:
                cached = text.encode("utf-8")
            elif ty == NORMAL:
                cached = text.replace(SPACE, " ").encode("utf-8")
            else:
                cached = b""              # unused / undefined types print nothing, as in llama.cpp
            self._pieces[tid] = cached
        return cached

    def decode(self, ids, special: bool = False) -> str:
        return b"".join(self.token_to_piece(int(i), special) for i in ids).decode("utf-8", errors="replace")

    def stream(self, special: bool = False) -> "StreamDecoder":
        return StreamDecoder(self, special)

    def id_of(self, piece: str) -> int | None:
        return self.ids.get(piece)


def canonical_types(tokens: list[str], types, end_of_generation=()) -> list[int]:
    """Token types as llama.cpp's converter writes them, whichever converter wrote `types`, plus the
    labels our decoding adds: end-of-generation tokens CONTROL (hidden, as llama.cpp makes them),
    <unusedN> placeholders UNUSED (Gemma GGUFs type them NORMAL; a model that emits one shows nothing)."""
    out = list(types)
    for i, t in enumerate(tokens):
        if t in _VISIBLE:
            out[i] = USER_DEFINED
        elif len(t) == 6 and _BYTE_TOKEN.fullmatch(t):      # byte fallback: a byte, whatever the file says
            out[i] = BYTE
        elif out[i] == NORMAL and t.startswith("<unused") and _UNUSED.fullmatch(t):
            out[i] = UNUSED
    for i in end_of_generation:
        out[i] = CONTROL
    return out


def _valid(text: str) -> str:
    """Lone surrogates (from JS strings) have no UTF-8: U+FFFD, as TextEncoder does."""
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


def _merge_ranks(merges: list[str]) -> dict:
    """"left right" -> rank: the merges as the file spells them, with no split and no tuple for each of Gemma 4's
    515k merges at load. A merge joins the text before its first space past the first character with the
    text after it; BPE looks a pair up as left + " " + right, which is that split because its symbols hold no
    spaces. A repeated merge keeps its first rank, as in llama.cpp."""
    return dict(zip(reversed(merges), range(len(merges) - 1, -1, -1)))


class StreamDecoder:
    """Incremental detokenizer: push(id) returns only complete UTF-8 characters."""

    def __init__(self, tok: Tokenizer, special: bool = False):
        self.tok, self.special = tok, special
        self.pending = b""

    def push(self, tid: int) -> str:
        data = self.pending + self.tok.token_to_piece(tid, self.special)
        cut = _complete_prefix(data)
        self.pending = data[cut:]
        return data[:cut].decode("utf-8", errors="replace")

    def flush(self) -> str:
        data, self.pending = self.pending, b""
        return data.decode("utf-8", errors="replace")


def _complete_prefix(data: bytes) -> int:
    """Length of data without a trailing incomplete UTF-8 sequence (at most 3 bytes held back)."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        b = data[n - back]
        if b < 0x80:
            return n                       # ASCII: everything before it is complete
        if b >= 0xC0:                      # a lead byte: is its sequence complete?
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return n if back >= need else n - back
    return n                               # only continuation bytes: let decode replace them
