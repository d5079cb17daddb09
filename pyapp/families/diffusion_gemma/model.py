"""DiffusionGemma forward on the GPU, op by op against the ops recorder (pyapp.runtime.ops).

One Gemma 4 26B-A4B text stack run in two modes (shared/notes/diffusion_gemma.md (c)); both are
pyapp.model.gemma4.Gemma4 with the few pieces that differ replaced, and mirror this family's
reference.py function for function:

  DiffusionEncoder.layers(ops)   the causal pass over the prompt or a committed block: Gemma 4's
                                 embedding and layers, writing the KV cache (sliding layers: a ring),
                                 each layer scaled by the encoder's enc_output_scale. Only its K/V are used.
  DiffusionDecoder.canvas(ops)   one denoising step over the canvas (T = its C tokens at positions P..):
                                 embed: e = token_embd[ids] * sqrt(hidden); with self-conditioning,
                                   soft = softmax(L) @ token_embd * sqrt(hidden) (L: the previous step's
                                   processed logits, left in state.canvas_logits by the sampler),
                                   s = down(gelu(gate(n)) * up(n)), n = self_cond_pre_norm(soft);
                                   x = rms(e [+ s]) (no gain); e, then e + s, in s.canvas_embd
                                 layers with the decoder's scale (output_scale); attention unmasked over the
                                   cached prefix (sliding layers: its last window - 1 positions) and the
                                   canvas's own K/V, the cache only read
                                 head: softcap(output_norm(x) @ token_embd^T) for every canvas row

Like gemma4.py it holds no buffers and does no I/O.
"""

from __future__ import annotations

from ...model.config import LayerConfig
from ...model.gemma4 import Gemma4
from ...model.weights import LayerWeights, ModelWeights
from .config import DiffusionGemmaConfig


class DiffusionEncoder(Gemma4):
    """reference: DiffusionReference.encode."""

    def layer_scale(self, w: LayerWeights):
        return w.enc_output_scale


class DiffusionDecoder(Gemma4):
    """reference: DiffusionReference.decode. self_conditioned: the step has previous logits (every step
    but a block's first); without them the self-conditioning signal is 0 and its MLP is skipped."""

    def __init__(self, cfg: DiffusionGemmaConfig, weights: ModelWeights, state, self_conditioned: bool):
        super().__init__(cfg, weights, state)
        self.self_conditioned = self_conditioned

    def canvas(self, ops) -> None:
        """The canvas's logits [T, vocab] into state.canvas_logits."""
        self.layers(ops)
        self.head_all(ops)

    def embed(self, ops) -> None:
        """reference: decode's embedding and self_conditioning; x0 in s.x."""
        s, w = self.s, self.w
        ops.embed(w.token_embd, s.ids, s.canvas_embd, scale=self.embed_scale)
        if self.self_conditioned:
            ops.soft_embed(w.token_embd, s.canvas_logits, s.soft, scale=self.embed_scale)
            ops.rms_norm(s.soft, s.xn, w.self_cond_pre_norm)
            ops.geglu(s.xn, s.act, gate=w.self_cond_gate, up=w.self_cond_up, gate_up=None)
            ops.linear(w.self_cond_down, s.act, s.self_cond)
            ops.add(s.canvas_embd, s.self_cond)
        ops.rms_norm(s.canvas_embd, s.x, None)

    def attention(self, ops, lc: LayerConfig, w: LayerWeights) -> None:
        """reference: attention through DecoderView: the canvas's q, k, v; attention over cache + canvas."""
        s = self.s
        ops.qkv(lc, w, s.xn, None if lc.sliding else self.w.rope_freqs)
        ops.attend_canvas(lc, s.q, s.kv[lc.kv_source], s.k, s.v, s.attn)
        ops.linear(w.attn_output, s.attn, s.attn_out)

    def head_all(self, ops) -> None:
        """reference: decode's tail: final norm, the tied output projection and softcap, every row."""
        s, cfg = self.s, self.cfg
        ops.rms_norm(s.x, s.xn, self.w.output_norm)
        ops.linear(self.w.head, s.xn, s.canvas_logits)
        if cfg.final_softcap:
            ops.softcap(s.canvas_logits, cfg.vocab_size, cfg.final_softcap)
