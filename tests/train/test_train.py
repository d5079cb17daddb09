"""LoRA training on the GPU (native backend): the gradients against torch autograd through transformers +
PEFT (the goldens of tests/test_lora_backward.py), a run that learns its data, the adapter it writes, resuming
from a checkpoint, and the finetune command.

Tolerances: the loss within 1e-5 and every A/B gradient within 2e-5 relative to the tensor's largest value
(seen: 3.5e-6 on F32, 2.3e-6 on Q4_K, float32 GPU against float64-built goldens stored as float32; the MoE
fixture: 1.8e-6 on F32 against torch (2.5e-6 with its experts' gate and up apart), 2.0e-6 on Q8_0 against the
float64 numpy oracle; losses within 1e-6).
"""

from __future__ import annotations

import copy
import json
from array import array

import numpy as np
import pytest

from pyapp.engine import Engine, SamplingParams
from pyapp.gguf import TensorInfo, read_gguf
from pyapp.model.lora import load_lora
from pyapp.model.weights import bind
from pyapp.source import BytesSource
from pyapp.train.adapter_out import PairSpec
from pyapp.train.backward import LoraBackward
from pyapp.train.checkpoint import checkpoint_from_bytes
from pyapp.train.data import build_dataset, load_dataset, Example
from pyapp.train.params import LoraParams
from pyapp.train.state import TrainState
from pyapp.train.trainer import Trainer, TrainConfig, TrainError

from support.paths import FIXTURES

pytestmark = pytest.mark.gpu

FIX = FIXTURES
LOSS_ATOL, GRAD_RTOL = 1e-5, 2e-5


def golden_gradients(model: str, qtype: str, tokens=None) -> dict:
    """The torch goldens (tests/fixtures/lora/<model>-<qtype>.grad.npz); where none was made (the MoE fixture's
    Q8_0 base) or for other tokens (every one a target), the numpy oracle on that file, on the F32 golden's
    tokens and mask (the oracle matches torch within 1e-5 on every committed golden: tests/test_lora_backward.py)."""
    path = FIX / "lora" / f"{model}-{qtype}.grad.npz"
    if path.exists() and tokens is None:
        return dict(np.load(path))
    from pyapp.reference.backward import LoraGradients
    ref = np.load(FIX / "lora" / f"{model}-f32.grad.npz")
    if tokens is not None:
        ref = {"tokens": np.asarray(tokens), "mask": np.asarray([0] + [1] * (len(tokens) - 1))}
    oracle = LoraGradients(read_gguf(FIX / f"{model}-{qtype}.gguf"), [(str(FIX / "lora" / f"{model}.gguf"), 1.0)])
    loss, grads = oracle.loss_and_grads(ref["tokens"], ref["mask"])
    return {"tokens": ref["tokens"], "mask": ref["mask"], "loss": loss, **grads}


def split_experts(g):
    """The same model with every layer's fused experts' gate|up (ffn_gate_up_exps) stored as ffn_gate_exps and
    ffn_up_exps, llama.cpp's other layout: the file's bytes with the two tensors appended, in memory."""
    data = bytearray(g.source.read(0, g.source.size))
    tensors = dict(g.tensors)
    for name, t in g.tensors.items():
        if not name.endswith(".ffn_gate_up_exps.weight"):
            continue
        hidden, two_ff, experts = t.shape
        rows = np.frombuffer(bytes(data[t.offset:t.offset + t.nbytes]), np.uint8).reshape(experts, 2, two_ff // 2, -1)
        del tensors[name]
        for i, half in enumerate(("gate", "up")):
            data += bytes(-len(data) % g.alignment)
            blob = rows[:, i].tobytes()
            split = name.replace("gate_up", half)
            tensors[split] = TensorInfo(split, (hidden, two_ff // 2, experts), t.type, len(data), len(blob))
            data += blob
    v = copy.copy(g)
    v.source, v.tensors = BytesSource(bytes(data)), tensors
    return v


@pytest.mark.parametrize("model,qtype,n_grads", [("gemma4-dense", "f32", 64), ("gemma4-dense", "q4_k", 64),
                                                 ("gemma4-moe", "f32", 60), ("gemma4-moe", "q8_0", 60),
                                                 ("gemma4-moe", "f32-split", 60), ("gemma4-moe", "f32-long", 60)],
                         ids=["dense-f32", "dense-q4_k", "moe-f32", "moe-q8_0", "moe-f32-split", "moe-f32-long"])
def test_gradients_match_torch_autograd(dev, model, qtype, n_grads):
    """The fixture adapter's pairs as the trained parameters; one sequence with its loss mask: the loss and
    every A/B gradient against torch. Dense: every target kind, PLE, KV sharing, sliding window, k_eq_v;
    MoE: the router (its LoRA too) and the experts beside the dense MLP, on every layer; its experts' gate
    and up fused in one tensor as the fixture has them, or apart (the same model, so the same goldens); and
    a 70-token sequence against the numpy oracle (140 slots over 4 experts: more than a 32-slot tile an
    expert, so the experts' dX reads its own grouping of them)."""
    split, long = qtype.endswith("-split"), qtype.endswith("-long")
    qtype = qtype.removesuffix("-split").removesuffix("-long")
    g = read_gguf(FIX / f"{model}-{qtype}.gguf")
    if split:
        g = split_experts(g)
    engine = Engine.open(g, context_length=128 if long else 64, device=dev)
    cfg = engine.config
    assert not split or not any(lc.experts_fused for lc in cfg.layers)
    adapter = load_lora(str(FIX / "lora" / f"{model}.gguf"), cfg, bind(cfg, g.tensors), 1.0, g.architecture)
    first = adapter.targets[0]
    params = LoraParams(dev, [PairSpec(t.name, t.layer, t.field, t.n_in, t.n_out) for t in adapter.targets],
                        first.rank, adapter.scale(first) * first.rank)
    params.load({t.name + suffix: np.frombuffer(raw, np.float32).tolist() for t in adapter.targets
                 for suffix, raw in zip((".lora_a", ".lora_b"), adapter.arrays(t))})
    golden = golden_gradients(model, qtype, np.random.default_rng(5).integers(0, cfg.vocab_size, 70) if long else None)
    tokens, mask = [int(x) for x in golden["tokens"]], [int(x) for x in golden["mask"]]
    state = TrainState(dev, cfg, engine.runner.layout, len(tokens) + 3, vocab_chunk=256)   # 2 vocabulary chunks
    params.attach(engine.runner.layout)
    try:
        backward = LoraBackward(dev, cfg, engine.runner.layout, state, params)
        fwd, bwd = dev.plan(), dev.plan()
        backward.forward(fwd)
        backward.backward(bwd)
        state.write_sequence(tokens, mask, sum(mask[1:]), g.source)
        dev.submit(fwd)
        dev.submit(bwd)
    finally:
        params.detach()
    loss = array("f", dev.read(state.loss, 0, 4))[0]
    assert abs(loss - float(golden["loss"])) <= LOSS_ATOL
    grads = params.split(dev.read(params.grads))
    assert set(grads) == set(golden) - {"tokens", "mask", "loss"} and len(grads) == n_grads
    for name, got in grads.items():
        want = np.asarray(golden[name]).reshape(-1)
        assert np.abs(want).max() > 0, name
        err = np.abs(np.asarray(got) - want).max() / np.abs(want).max()
        assert err <= GRAD_RTOL, f"{name}: relative error {err:.2e}"


# ---- a whole run on the demo model ---------------------------------------------------------------------

TEXT = "the quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module")
def demo(dev):
    g = read_gguf(FIX / "demo.gguf")
    return g, Engine.open(g, context_length=128, device=dev)


def text_dataset(engine, copies: int = 2, val: int = 0):
    """The same paragraph `copies` times to train on (and `val` held out): a model that learns it reproduces it."""
    data = "\n\n".join([TEXT] * (copies + val)).encode()
    ds = load_dataset(data, "fox.txt", engine.tokenizer, seq_len=64, val_fraction=0)
    if val:
        ds = build_dataset("text", [Example(s.ids, s.mask, s.line) for s in ds.train], 64,
                           val_fraction=val / (copies + val), seed=0)
    return ds


def test_training_learns_and_the_adapter_reproduces_the_text(demo, tmp_path):
    """Loss falls by more than half; the written adapter, applied by the engine, makes greedy decoding say the
    training text; the adapter obeys llama.cpp's loader rules."""
    g, engine = demo
    ds = text_dataset(engine)
    tr = Trainer(engine, ds, TrainConfig(rank=8, alpha=16, steps=24, batch=1, lr=1e-2, warmup=2, seed=3))
    try:
        reports = [tr.train_step() for _ in range(tr.total_steps)]
        adapter = tr.adapter_gguf()
    finally:
        tr.close()
    assert tr.done and [r.step for r in reports] == list(range(1, 25))
    first, last = reports[0].loss, reports[-1].loss
    assert last <= 0.5 * first, (first, last)
    assert last < 0.2
    assert all(r.tokens_per_s > 0 and r.grad_norm > 0 for r in reports)
    path = tmp_path / "fox.gguf"
    path.write_bytes(adapter)

    ids = ds.train[0].ids                                     # <bos> + the text
    tuned = Engine.open(g, context_length=128, device=engine.dev, lora=[(str(path), 1.0)])
    res = tuned.generate(ids[:3], SamplingParams(temperature=0.0, max_tokens=len(ids) - 3))
    assert res.tokens == ids[3:]
    base = engine.generate(ids[:3], SamplingParams(temperature=0.0, max_tokens=len(ids) - 3))
    assert base.tokens != ids[3:]                            # the base model does not know it

    gguf = pytest.importorskip("gguf")
    from support.adapters import llama_cpp_load_errors
    reader = gguf.GGUFReader(str(path))
    assert llama_cpp_load_errors(reader, gguf.GGUFReader(str(FIX / "demo.gguf"))) == []
    names = {t.name for t in reader.tensors}
    assert "blk.0.attn_q.weight.lora_a" in names and "blk.3.ffn_down.weight.lora_b" in names
    assert reader.fields["adapter.lora.alpha"].contents() == 16.0


def test_training_a_mixture_of_experts_model(dev):
    """The MoE fixture (router, experts and dense MLP on every layer), its router adapted too: 5 updates take
    the loss down by more than 30% (seen: 6.83 -> 4.35)."""
    g = read_gguf(FIX / "gemma4-moe-f32.gguf")
    engine = Engine.open(g, context_length=64, device=dev)
    ds = text_dataset(engine)
    tr = Trainer(engine, ds, TrainConfig(rank=4, alpha=8, targets="q,k,v,o,gate,up,down,router", steps=5, batch=1,
                                         lr=1e-2, warmup=0, seed=2))
    try:
        assert any(p.spec.field == "router" for p in tr.params.pairs)
        reports = [tr.train_step() for _ in range(tr.total_steps)]
    finally:
        tr.close()
    first, last = reports[0].loss, reports[-1].loss
    assert last <= 0.7 * first, (first, last)
    assert all(r.grad_norm > 0 for r in reports)


def test_resume_continues_exactly(demo):
    """2 updates straight, or 1 (the warm-up's), a checkpoint, a new trainer resumed from it and 1 more: the same
    parameters, optimizer moments, loss log and data position."""
    g, engine = demo
    ds = text_dataset(engine, copies=3)
    config = TrainConfig(rank=4, alpha=8, steps=2, batch=2, lr=5e-3, warmup=1, seed=1)
    straight = Trainer(engine, ds, config)
    try:
        for _ in range(2):
            straight.train_step()
        want = straight.checkpoint_bytes()
    finally:
        straight.close()
    first = Trainer(engine, ds, config)
    try:
        first.train_step()
        ck = checkpoint_from_bytes(first.checkpoint_bytes())
    finally:
        first.close()
    resumed = Trainer(engine, ds, config, checkpoint=ck)
    try:
        assert resumed.step == 1
        resumed.train_step()
        got = resumed.checkpoint_bytes()
    finally:
        resumed.close()
    a, b = checkpoint_from_bytes(want), checkpoint_from_bytes(got)
    assert a.step == b.step == 2 and a.data == b.data
    assert [e["loss"] for e in a.log] == [e["loss"] for e in b.log]
    for name, values in a.params.items():
        np.testing.assert_array_equal(np.asarray(b.params[name]), np.asarray(values), err_msg=name)
        np.testing.assert_array_equal(np.asarray(b.optimizer.m[name]), np.asarray(a.optimizer.m[name]))


def test_validation_keeps_the_best_parameters(demo):
    """With held-out data the validation loss is measured every val_every updates and after the last; the
    adapter written is the one of the best validation loss."""
    g, engine = demo
    ds = text_dataset(engine, copies=2, val=1)
    tr = Trainer(engine, ds, TrainConfig(rank=4, alpha=8, steps=5, batch=1, lr=1e-2, warmup=0, val_every=2))
    try:
        reports = [tr.train_step() for _ in range(5)]
        assert [r.val_loss is not None for r in reports] == [False, True, False, True, True]
        vals = {r.step: r.val_loss for r in reports if r.val_loss is not None}
        assert tr.best_step == min(vals, key=vals.get) and tr.best_val_loss == min(vals.values())
        assert abs(tr.validate() - vals[5]) < 1e-6                 # the current parameters, measured again
        if tr.best_step != 5:
            assert tr.adapter_gguf(best=True) != tr.adapter_gguf(best=False)
    finally:
        tr.close()


def test_refusals(dev, demo):
    g, engine = demo
    ds = text_dataset(engine)
    with pytest.raises(TrainError, match="rank must be an integer from 1 to 16 .*, got 40"):
        Trainer(engine, ds, TrainConfig(rank=40))
    with pytest.raises(TrainError, match="unknown LoRA target"):
        Trainer(engine, ds, TrainConfig(targets="q,embed"))
    streamed = Engine.open(read_gguf(FIX / "gemma4-moe-f32.gguf"), context_length=64, device=dev,
                           expert_cache_mib=0.75)              # 2 of the 4 experts a layer on the GPU
    assert streamed.runner.experts is not None
    with pytest.raises(TrainError, match="needs every expert in GPU memory"):
        Trainer(streamed, ds, TrainConfig())
    adapted = Engine.open(read_gguf(FIX / "gemma4-dense-f32.gguf"), context_length=64, device=dev,
                          lora=[(str(FIX / "lora" / "gemma4-dense.gguf"), 1.0)])
    with pytest.raises(TrainError, match="adapter is applied"):
        Trainer(adapted, ds, TrainConfig())


def test_finetune_command(tmp_path, capsys):
    """The CLI end to end: 2 updates, then --resume for 1 more; the adapter and the checkpoint are written."""
    from pyapp.__main__ import main
    data = tmp_path / "chats.jsonl"
    data.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": f"Say hi {i}"},
                                                        {"role": "assistant", "content": "hi"}]})
                              for i in range(3)) + "\n")
    out = tmp_path / "a.gguf"
    args = ["finetune", str(FIX / "demo.gguf"), "--data", str(data), "--out", str(out), "--rank", "2",
            "--batch", "1", "--val-fraction", "0", "--lr", "1e-3"]
    assert main(args + ["--steps", "2"]) == 0
    printed = capsys.readouterr()
    assert "step 2/2  loss" in printed.out and "tok/s" in printed.out
    assert "3 examples (chat): 3 to train on" in printed.err
    assert read_gguf(out).metadata["general.type"] == "adapter"
    ck = checkpoint_from_bytes((tmp_path / "a.gguf.ckpt").read_bytes())
    assert ck.step == 2 and len(ck.log) == 2
    assert main(args + ["--steps", "3", "--resume"]) == 0
    assert "step 3/3  loss" in capsys.readouterr().out
    assert main(["finetune", str(FIX / "demo.gguf"), "--data", str(tmp_path / "none.jsonl"), "--out", str(out)]) == 2
