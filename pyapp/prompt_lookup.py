"""Prompt lookup: guess the next tokens of a text from the text itself (speculative decoding's drafts).

Where text repeats (code, a quoted prompt, lists, a model stuck in a loop) the tokens that
followed the last few tokens the previous time they occurred are a good guess of what
follows now, and a free one: no second model. `draft` takes the history's last n tokens,
n = 3, then 2, then 1, finds their latest earlier occurrence, and proposes the tokens that
followed it. A proposal that runs into the end of the history continues with its own tokens,
so a loop of period p drafts as far as asked, not just p tokens.

Each n-gram's latest start (among those with a token after them) is kept in a dict, updated
as tokens arrive: a draft costs a few lookups, not a scan of the history.
"""

from __future__ import annotations

MAX_NGRAM = 3


class PromptLookup:
    def __init__(self, tokens=(), max_ngram: int = MAX_NGRAM):
        self.max_ngram = max_ngram
        self.tokens: list[int] = []
        self._latest = [dict() for _ in range(max_ngram + 1)]   # n -> {n-gram: start of its latest followed occurrence}
        self.extend(tokens)

    def extend(self, tokens) -> None:
        for t in tokens:
            self.append(t)

    def append(self, token: int) -> None:
        """One more token of the history: the n-grams that end just before it now have a follower."""
        end = len(self.tokens)
        for n in range(1, min(self.max_ngram, end) + 1):
            self._latest[n][tuple(self.tokens[end - n:end])] = end - n
        self.tokens.append(int(token))

    def draft(self, limit: int, min_ngram: int = 1) -> list[int]:
        """Up to `limit` tokens that followed the latest earlier occurrence of the history's longest
        matching suffix (n-grams of max_ngram down to min_ngram tokens); [] when none occurs earlier."""
        seq, end = self.tokens, len(self.tokens)
        if limit <= 0:
            return []
        for n in range(min(self.max_ngram, end), min_ngram - 1, -1):
            start = self._latest[n].get(tuple(seq[end - n:]))
            if start is None:
                continue
            src = start + n              # the first token that followed; < end
            out: list[int] = []
            for i in range(limit):
                j = src + i
                out.append(seq[j] if j < end else out[j - end])
            return out
        return []
