"""An assistant drafter's draft step on the GPU, op by op against the ops recorder (pyapp.runtime.ops), as
reference.py's `step` computes it (one statement per reference op, in its order):

  joined = [target_embed(t) * sqrt(backbone), s]       s: the target's final-normed row, or the last step's
  x = joined @ pre_projection^T
  each layer: q from x, attention over the target's K/V of its kind (the keys before the position: a
              sliding layer's last window + 1 of them), o projection, GeGLU MLP, post-norms, output scale
  y = output_norm(x)
  the draft = argmax(y @ token_embd^T)                 (its tied head, no softcap; no logits written)
  state = y @ post_projection^T                        (the next step's s)

It holds no buffers: the DrafterState does (runner.py), and the target's KV caches and token embedding are
read in place.
"""

from __future__ import annotations

import math


class DrafterForward:
    def __init__(self, cfg, weights, state, target_embd):
        self.cfg, self.w, self.s = cfg, weights, state
        self.target_embd = target_embd                      # the target's token_embd (GpuTensor)
        self.embed_scale = math.sqrt(cfg.backbone_hidden)

    def step(self, ops, draft: int) -> None:
        """reference: step; the draft's id into state.drafts[draft], its state into state.state_out."""
        s, w = self.s, self.w
        ops.embed(self.target_embd, s.ids, s.joined, scale=self.embed_scale)   # joined's first half
        ops.linear(w.pre_projection, s.joined, s.x)
        for lc in self.cfg.layers:
            self.layer(ops, lc)
        ops.rms_norm(s.x, s.y, w.output_norm)
        ops.argmax_rows(w.token_embd, s.y, s.drafts, draft, 0.0)
        ops.linear(w.post_projection, s.y, s.state_out)

    def layer(self, ops, lc) -> None:
        """reference: layer."""
        s, w = self.s, self.w.layers[lc.index]
        ops.rms_norm(s.x, s.xn, w.attn_norm)
        ops.q_proj(lc, w, s.xn, None if lc.sliding else self.w.rope_freqs)
        ops.attend(lc, s.q, s.kv[lc.index], s.attn, keys_before=1, sliding_keys=self.cfg.sliding_keys)
        ops.linear(w.attn_output, s.attn, s.attn_out)
        ops.add_norm(s.attn_out, w.post_attention_norm, into=s.x)
        ops.rms_norm(s.x, s.xn, w.ffn_norm)
        ops.geglu(s.xn, s.act, gate=w.ffn_gate, up=w.ffn_up, gate_up=None)
        ops.linear(w.ffn_down, s.act, s.ffn_out)
        ops.add_norm(s.ffn_out, w.post_ffw_norm, into=s.x)
        ops.scale(s.x, w.output_scale)
