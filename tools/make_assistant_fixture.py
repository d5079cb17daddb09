"""Make the tiny Gemma 4 assistant drafter fixture and its golden draft steps (tests/fixtures/assistant/).

    python tools/make_assistant_fixture.py [--out tests/fixtures] [--seed 7]

The target is the committed gemma4-dense-f32.gguf (E2B's structure; tools/make_fixtures.py).
The drafter is a random Gemma4AssistantForCausalLM built to read that target's KV
(its head dims, KV heads, window and rope match the target's), every weight and gain
random (fan-in scaled matrices, norms 1 + 0.2 N(0, 1), random layer scalars, nothing
damped), converted by llama.cpp's convert_hf_to_gguf.py (arch gemma4-assistant, F32).
llama.cpp's converter drops the masked (ordered) embedding, so the drafter uses the full
tied head (use_ordered_embeddings=False).

The golden chains the drafter the way transformers' assisted generation does
(Gemma4AssistantCandidateGenerator): the target runs the prompt once (float32, eager,
no cache) and returns the K/V of its last non-shared sliding and full layers and its
final-normed hidden states; each draft step feeds [target embedding of the newest
token, last state] at the newest token's position, takes the argmax as the next token
and the projected state as the next state. The K/V and the position stay fixed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from make_fixtures import DENSE, G, S, VOCAB, convert, hf_model, load_gguf_weights, name_map  # noqa: E402

TARGET = "gemma4-dense-f32"
TARGET_VOCAB = 512
TARGET_SEED = 0
STEM = "gemma4-assistant-f32"
DRAFT_STEPS = 4
# prompt lengths: shorter than the window + 1, equal to it, and longer
PROMPT_LENGTHS = (3, 5, 13)

# the drafter: 3 layers S S G, hidden 128, 2 query heads over the target's 1 KV head
DRAFTER = dict(hidden_size=128, intermediate_size=96, num_hidden_layers=3, num_attention_heads=2,
               num_key_value_heads=DENSE["num_key_value_heads"], head_dim=DENSE["head_dim"],
               global_head_dim=DENSE["global_head_dim"], sliding_window=DENSE["sliding_window"],
               layer_types=[S, S, G], hidden_size_per_layer_input=0, vocab_size_per_layer_input=0,
               num_kv_shared_layers=3, use_double_wide_mlp=False, final_logit_softcapping=None)


def drafter_model(seed: int):
    import torch
    from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM, Gemma4TextConfig
    text = Gemma4TextConfig(vocab_size=TARGET_VOCAB, max_position_embeddings=4096, **DRAFTER)
    cfg = Gemma4AssistantConfig(text_config=text, backbone_hidden_size=DENSE["hidden_size"],
                                use_ordered_embeddings=False)
    cfg._attn_implementation = "eager"
    cfg.text_config._attn_implementation = "eager"
    model = Gemma4AssistantForCausalLM(cfg).float().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
            elif "layer_scalar" in name:
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
            else:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
    return model


def target_model(target_gguf: Path):
    model = hf_model(DENSE, TARGET_VOCAB, TARGET_SEED)
    load_gguf_weights(model, target_gguf, name_map(model, target_gguf))
    return model


def write_checkpoint(model, out: Path) -> None:
    from hf_tokenizer import reduce_vocab, write_tokenizer
    from pyapp.gguf import read_gguf
    model.config.architectures = ["Gemma4AssistantForCausalLM"]
    model.save_pretrained(out, safe_serialization=True)
    write_tokenizer(reduce_vocab(read_gguf(VOCAB).metadata, TARGET_VOCAB), out)


def draft_chain(target, drafter, prompt: list[int]) -> dict[str, np.ndarray]:
    """The target on the prompt, then DRAFT_STEPS drafter steps chained as transformers does."""
    import torch
    with torch.no_grad():
        out = target(torch.tensor([prompt]), output_hidden_states=True, return_shared_kv_states=True,
                     use_cache=False)
        kv = {k: (v[0], v[1]) for k, v in out.shared_kv_states.items()}
        state = out.hidden_states[-1][:, -1:]
        token = out.logits[:, -1:].argmax(-1)
        position = torch.tensor([[len(prompt)]])
        mask = torch.ones(1, len(prompt) + 1, dtype=torch.long)
        embed = target.get_input_embeddings()
        result = {"prompt": np.array(prompt, np.int32), "first_token": token.numpy().reshape(-1).astype(np.int32),
                  "target_state": state[0, 0].numpy(),
                  "k_sliding": kv[S][0][0].numpy(), "v_sliding": kv[S][1][0].numpy(),
                  "k_full": kv[G][0][0].numpy(), "v_full": kv[G][1][0].numpy()}
        logits, states, tokens = [], [], []
        for _ in range(DRAFT_STEPS):
            inputs = torch.cat([embed(token), state], dim=-1)
            step = drafter(inputs_embeds=inputs, attention_mask=mask, position_ids=position,
                           shared_kv_states=kv, use_cache=False)
            token = step.logits.argmax(-1)
            state = step.last_hidden_state
            logits.append(step.logits[0, 0].numpy())
            states.append(state[0, 0].numpy())
            tokens.append(int(token))
    result["logits"] = np.stack(logits).astype(np.float32)
    result["states"] = np.stack(states).astype(np.float32)
    result["tokens"] = np.array(tokens, np.int32)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "tests" / "fixtures"))
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    out = Path(args.out)
    target = target_model(out / f"{TARGET}.gguf")
    drafter = drafter_model(args.seed)
    dest = out / "assistant" / f"{STEM}.gguf"
    dest.parent.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "hf"
        write_checkpoint(drafter, ckpt)
        convert(ckpt, "f32", dest, "gemma4-assistant (random weights, test model)")
    rng = np.random.default_rng(args.seed)
    golden = {}
    for i, n in enumerate(PROMPT_LENGTHS):
        prompt = [2] + rng.integers(5, TARGET_VOCAB, n - 1).tolist()
        for key, value in draft_chain(target, drafter, prompt).items():
            golden[f"{key}_{i}"] = value
    np.savez_compressed(dest.parent / f"{STEM}.golden.npz", **golden)
    print(f"{dest.name}: {dest.stat().st_size / 2**20:.2f} MiB; draft tokens "
          + " ".join(str(golden[f"tokens_{i}"].tolist()) for i in range(len(PROMPT_LENGTHS))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
