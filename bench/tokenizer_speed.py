"""Times of the vocabulary's parse, the tokenizer's build and encoding 10 kB of text (the figures the tests
used to assert; tests/text/test_tokenizer.py and tests/formats/test_gguf.py now count the work instead, DESIGN.md rule 7).

    python bench/tokenizer_speed.py [VOCAB.gguf] [--repeat 3]      # default: the vendored Gemma 4 vocabulary

Prints one JSON line: the best of --repeat runs of each, in seconds, and the token count.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pyapp.gguf import read_gguf  # noqa: E402
from pyapp.tokenizer import Tokenizer  # noqa: E402

VOCAB = ROOT / ".cache" / "llama.cpp" / "models" / "ggml-vocab-gemma-4.gguf"


def text_10k() -> str:
    rng = random.Random(1)
    words = ["the", "model", "runs", "in", "a", "browser", "tab", "with", "WebGPU", "Pyodide", "données", "模型", "🙂"]
    return " ".join(rng.choice(words) + rng.choice(["", ",", ".", "!\n"]) for _ in range(3000))[:10_000]


def best(fn, repeat: int):
    out, t_best = None, float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        t_best = min(t_best, time.perf_counter() - t)
    return out, t_best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("vocab", nargs="?", default=str(VOCAB))
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    g, parse_s = best(lambda: read_gguf(args.vocab), args.repeat)
    tok, build_s = best(lambda: Tokenizer.from_metadata(g.metadata), args.repeat)
    text = text_10k()
    # a fresh tokenizer per run: encode would otherwise answer from its cache of runs
    fresh = [Tokenizer.from_metadata(g.metadata) for _ in range(args.repeat)]
    ids, encode_s = best(lambda: fresh.pop().encode(text), args.repeat)
    print(json.dumps({"vocab": Path(args.vocab).name, "parse_s": round(parse_s, 4), "build_s": round(build_s, 4),
                      "encode_10kB_s": round(encode_s, 4), "tokens": len(ids)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
