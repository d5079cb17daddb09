"""Gemma 4's assistant drafters (`gemma-4-E2B-it-assistant` ...): a few layers that draft tokens for a
Gemma 4 target from the target's own state, for speculative decoding.

Not a model of its own: it has no K/V projections and reads the target's K/V cache (its last
non-shared sliding and full layers'), and it starts from the target's final hidden state. Files:
llama.cpp's converter, architecture `gemma4-assistant`.

    config.py       DrafterConfig: hyperparameters from gemma4-assistant.* keys, checked against a target
    weights.py      its tensors, bound once
    model.py        DrafterForward: a draft step on the GPU, op by op against the ops recorder
    runner.py       DrafterState, GpuDrafter: its buffers, weights and plans beside a target's Runner
    source.py       GpuDrafts: the engine's draft source (standard library only: it runs in the page)
    reference.py    DrafterReference: the numpy oracle (transformers' Gemma4AssistantForCausalLM, chained
                    as its assisted generation chains it); ReferenceDrafts, the numpy drafter as a source
"""
