"""Logits of a token sequence, the one result type of every forward (GPU engine and reference).

Standard library only (the browser has no numpy): float32 rows in one array.
numpy reads it without copying: `np.asarray(logits)` is [n_tokens, vocab].
"""

from __future__ import annotations

from array import array


class Logits:
    def __init__(self, data: array, vocab: int):
        if len(data) % max(vocab, 1):
            raise ValueError(f"{len(data)} floats are not whole rows of {vocab}")
        self.data, self.vocab = data, vocab

    @classmethod
    def from_rows(cls, rows) -> "Logits":
        """From rows of native float32: bytes (GPU readbacks) or float32 arrays."""
        data = array("f")
        vocab = 0
        for r in rows:
            before = len(data)
            data.frombytes(memoryview(r).cast("B"))
            vocab = len(data) - before
        return cls(data, vocab)

    @property
    def n_tokens(self) -> int:
        return len(self.data) // self.vocab if self.vocab else 0

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n_tokens, self.vocab)

    def __len__(self) -> int:
        return self.n_tokens

    def row(self, i: int) -> array:
        i = i + self.n_tokens if i < 0 else i
        return self.data[i * self.vocab:(i + 1) * self.vocab]

    def argmax_row(self, i: int = -1) -> int:
        """The first highest logit of row i (as numpy's argmax)."""
        r = self.row(i)
        return max(range(len(r)), key=r.__getitem__)

    def tolist(self) -> list[list[float]]:
        return [self.row(i).tolist() for i in range(self.n_tokens)]

    def __array__(self, dtype=None, copy=None):
        import numpy as np
        a = np.frombuffer(self.data, dtype=np.float32).reshape(self.shape)
        return a if dtype is None else a.astype(dtype)
