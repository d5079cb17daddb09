#!/usr/bin/env python3
"""The GPU work of every recorded plan, as text: to check that a change to the model file or the ops
recorder (pyapp/model/gemma4.py, pyapp/runtime/ops.py, pyapp/train/backward.py) keeps the kernels each
step dispatches, in their order, with the same buffers.

    .venv/bin/python tools/plan_listing.py OUT_DIR [--only CASE ...]     # one listing a case
    .venv/bin/python tools/plan_listing.py OUT_DIR --check REF_DIR        # and how each plan differs from REF_DIR's

--check says, plan by plan, whether the two listings are identical, hold the same lines in another order
(the same dispatches, reordered), or differ in their work (the lines only one side holds, counted).

A listing names each plan (Runner.layers_program for every step size, the sampled one-token step and the
few-token step of speculative decoding; head_plan; greedy_plan; DiffusionGemma's canvas programs; the
training forward and backward) and then its work, one line each:

    K: d SHADER:ENTRY prelude=HASH {constants} (x, y, z) | BINDING=BUFFER[offset:size] ...   a dispatch
    K: c SRC[offset] -> DST[offset] SIZE                                                       a copy

K is the line's part of the program (a Plan, or `K: rounds LAYER:` a streamed experts' plan, replayed
per round of experts).

Buffers are named by their label and the order of their creation among buffers of that label (`x#0`),
so a plan that binds another buffer, or another range of one, reads differently. Cases cover the fixture
models (dense Q4_K and Q6_K, MoE Q8_0, demo), toys for the Q4_K experts and Q4_0's int8 units, LoRA
adapters (prefill, decode, training), streamed experts, tensors split over the binding limit, the PLE
table left in the file, f16 tiles, a device binding 8 storage buffers a shader (no residual fusion), the
runner's decode fusions switched off, and DiffusionGemma. It runs on the native backend (lavapipe is fine: nothing is submitted).

Not a test: the listing changes with any kernel's tuning (threads per row, includes), which is fine, so
it is compared before and after a change, not against a committed copy.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
FIX = ROOT / "tests" / "fixtures"


# -- naming what a plan holds ------------------------------------------------------------------------

class Names:
    """Buffer -> 'label#k' (the k-th buffer created with that label since the case began)."""

    def __init__(self):
        self.count: dict = {}

    def tag(self, buf) -> None:
        k = self.count.get(buf.label, 0)
        self.count[buf.label] = k + 1
        buf._listing_name = f"{buf.label or 'buffer'}#{k}"

    @staticmethod
    def of(buf) -> str:
        return getattr(buf, "_listing_name", f"{buf.label or 'buffer'}#?")


def instrument(dev, names: Names) -> None:
    """Name every buffer the device creates from now on; keep every bind group's entries beside it."""
    make_buffer, make_bind_group = dev.buffer, dev.bind_group

    def buffer(size, kind="storage", label=""):
        b = make_buffer(size, kind, label)
        names.current.tag(b)
        return b

    def bind_group(pipeline, resources):
        bg = make_bind_group(pipeline, resources)
        bg._listing = {name: (r, 0, r.size) if not isinstance(r, tuple) else r for name, r in resources.items()}
        return bg

    dev.buffer, dev.bind_group = buffer, bind_group
    names.current = Names()
    names.current.tag(dev.dummy)
    names.current.tag(dev.dummy_out)


def plan_lines(plan) -> list[str]:
    out = []
    for op in plan.ops:
        if op[0] == "d":
            _, p, bg, x, y, z = op
            shader, entry, prelude, consts = p.key
            h = hashlib.sha1(prelude.encode()).hexdigest()[:8]
            binds = " ".join(f"{n}={Names.of(b)}[{off}:{size}]" for n, (b, off, size) in sorted(bg._listing.items()))
            out.append(f"d {shader}:{entry} prelude={h} {dict(consts)} ({x}, {y}, {z}) | {binds}")
        else:
            _, src, so, dst, do, n = op
            out.append(f"c {Names.of(src)}[{so}] -> {Names.of(dst)}[{do}] {n}")
    return out


def program_lines(program) -> list[str]:
    from pyapp.gpu import Plan
    parts = program if isinstance(program, list) else [program]
    out = []
    for k, part in enumerate(parts):         # each line names its part: a move between plans shows
        if isinstance(part, Plan):
            out += [f"{k}: {line}" for line in plan_lines(part)]
        else:                                # ExpertRounds
            out += [f"{k}: rounds {part.layer}: {line}" for line in plan_lines(part.plan)]
    return out


def dispatches(program) -> int:
    parts = program if isinstance(program, list) else [program]
    return sum(op[0] == "d" for part in parts for op in getattr(part, "plan", part).ops)


# -- the cases --------------------------------------------------------------------------------------------

def runner_plans(eng) -> dict:
    """Every plan a generation (and speculative decoding) records, by name."""
    r, out = eng.runner, {}
    for T in r.step_sizes:
        out[f"layers T={T}"] = r.layers_program(T)
    if r.decodes_ahead:
        out["layers T=1 sampled"] = r.layers_program(1, sampled=True)
    out[f"layers T={r.state.head_rows} few"] = r.layers_program(r.state.head_rows, few=True)
    for row, sample in ((0, True), (0, False), (3, False)):
        out[f"head row={row} sample={sample}"] = r.head_plan(row, sample)
    for first in (0, 1):
        out[f"greedy first={first}"] = r.greedy_plan(first)
    return out


def diffusion_plans(eng) -> dict:
    r, out = eng.runner, {}
    for T in r.step_sizes:
        out[f"encoder T={T}"] = r.layers_program(T)
    for sc in (False, True):
        out[f"canvas self_conditioned={sc}"] = r.canvas_program(sc)
    return out


def training_plans(dev, model: str, qtype: str) -> dict:
    """LoraBackward's forward and backward with the fixture adapter's pairs trained (as tests/train/test_train.py)."""
    from pyapp.engine import Engine
    from pyapp.gguf import read_gguf
    from pyapp.model.lora import load_lora
    from pyapp.model.weights import bind
    from pyapp.train.adapter_out import PairSpec
    from pyapp.train.backward import LoraBackward
    from pyapp.train.params import LoraParams
    from pyapp.train.state import TrainState
    g = read_gguf(FIX / f"{model}-{qtype}.gguf")
    eng = Engine.open(g, context_length=64, device=dev)
    cfg = eng.config
    adapter = load_lora(str(FIX / "lora" / f"{model}.gguf"), cfg, bind(cfg, g.tensors), 1.0, g.architecture)
    first = adapter.targets[0]
    params = LoraParams(dev, [PairSpec(t.name, t.layer, t.field, t.n_in, t.n_out) for t in adapter.targets],
                        first.rank, adapter.scale(first) * first.rank)
    state = TrainState(dev, cfg, eng.runner.layout, 20, vocab_chunk=256)
    params.attach(eng.runner.layout)
    try:
        backward = LoraBackward(dev, cfg, eng.runner.layout, state, params)
        fwd, bwd = dev.plan(), dev.plan()
        backward.forward(fwd)
        backward.backward(bwd)
    finally:
        params.detach()
    return {"train forward": fwd, "train backward": bwd}


@contextlib.contextmanager
def patched(obj, changes: dict):
    """Set items of a dict (or attributes of an object) for the block."""
    is_dict = isinstance(obj, dict)
    missing = object()
    old = {k: (obj.get(k, missing) if is_dict else getattr(obj, k)) for k in changes}
    for k, v in changes.items():
        obj.__setitem__(k, v) if is_dict else setattr(obj, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is missing:
                del obj[k]
            else:
                obj.__setitem__(k, v) if is_dict else setattr(obj, k, v)


def cases(dev, tmp: Path) -> dict:
    """name -> a function returning {plan name: program} (run in a fresh naming of buffers)."""
    import make_bench_model as mbm
    from pyapp.engine import Engine
    from pyapp.gguf import read_gguf
    from pyapp.gpu import kernels as K
    from pyapp.runtime.memory import MIB, plan_memory
    from pyapp.model.config import Gemma4Config
    from pyapp.model.weights import bind

    def toy(shape, quant, **kw):
        path = tmp / f"{shape}-{quant}.gguf"
        if not path.exists():
            mbm.write(shape, mbm.T[quant], str(path), seed=1, **kw)
        return read_gguf(path)

    def fixture(name):
        return read_gguf(FIX / f"{name}.gguf")

    def engine(g, **kw):
        kw.setdefault("context_length", 256)
        return runner_plans(Engine.open(g, device=dev, **kw))

    def unfused(g, **kw):
        """The runner's decode fusions off (tests/engine/test_engine.py's plain plans)."""
        eng = Engine.open(g, device=dev, context_length=128, **kw)
        eng.runner.fuse_residual = False
        eng.runner._plans.clear()
        return runner_plans(eng)

    def lora(model):
        return [(str(FIX / "lora" / f"{model}.gguf"), 1.0)]

    def streamed(name, slots):
        g = fixture(name)
        cfg = Gemma4Config.from_gguf(g)
        each = plan_memory(dev.limits, cfg, bind(cfg, g.tensors), 128, 16).expert_each
        return engine(g, context_length=128, chunk=16, expert_cache_mib=(slots * each + 64) / MIB)

    def limited(setting, value, fn):
        def run():
            with patched(dev.limits, {setting: value}):
                return fn()
        return run

    def units(qtype, fn, block_units=False):
        """Every matrix of qtype on the int8 units (tests/engine/test_engine.py's int8 decode cases)."""
        def run():
            with patched(K.INT8_UNIT_MIN_ROWS, {qtype: 0}), patched(dev, {"int8_block_units": block_units}):
                return fn()
        return run

    def diffusion(quant):
        from pyapp.engine import Engine as E
        return diffusion_plans(E.open(toy("tiny-diffusion", quant), device=dev, context_length=96, chunk=16))

    return {
        "dense-q4_k": lambda: engine(fixture("gemma4-dense-q4_k"), chunk=128),
        "dense-q4_k-chunk16-f32": lambda: engine(fixture("gemma4-dense-q4_k"), chunk=16, int8=False),
        "dense-q4_k-8-buffers": limited("max_storage_buffers_per_shader_stage", 8,
                                        lambda: engine(fixture("gemma4-dense-q4_k"), chunk=16)),
        "dense-q4_k-ple-in-file": lambda: engine(fixture("gemma4-dense-q4_k"), chunk=16, ple_in_file=True),
        "dense-q4_k-split": limited("max_storage_buffer_binding_size", 32 << 10,
                                    lambda: engine(fixture("gemma4-dense-q4_k"), context_length=128, chunk=128)),
        "dense-q6_k-head-units": units(K.ggml.Q6_K, lambda: engine(fixture("gemma4-dense-q6_k"), chunk=16)),
        "dense-q8_0-units": units(K.ggml.Q8_0, lambda: engine(fixture("gemma4-dense-q8_0"), chunk=16),
                                  block_units=True),
        "dense-f16-tiles": lambda: engine(fixture("gemma4-dense-f16"), chunk=16, f16=True),
        "dense-q4_k-unfused": lambda: unfused(fixture("gemma4-dense-q4_k"), chunk=16),
        "moe-q8_0": lambda: engine(fixture("gemma4-moe-q8_0"), chunk=128),
        "moe-q8_0-unfused": lambda: unfused(fixture("gemma4-moe-q8_0"), chunk=16),
        "moe-q8_0-streamed": lambda: streamed("gemma4-moe-q8_0", 2),
        "moe-q8_0-8-buffers": limited("max_storage_buffers_per_shader_stage", 8,
                                      lambda: engine(fixture("gemma4-moe-q8_0"), chunk=16)),
        "demo": lambda: engine(fixture("demo"), chunk=128),
        "toy-tiny-q4_0-units": units(K.ggml.Q4_0, lambda: engine(toy("tiny", "Q4_0"), chunk=16), block_units=True),
        "toy-moe-q4_k": lambda: engine(toy("tiny-moe", "Q4_K"), chunk=128),
        "toy-moe-q8_0-split": limited("max_storage_buffer_binding_size", 300 << 10,
                                      lambda: engine(toy("tiny-moe", "Q8_0"), chunk=16)),
        "lora-dense-f32": lambda: engine(fixture("gemma4-dense-f32"), chunk=16, lora=lora("gemma4-dense"),
                                         int8=False),
        "lora-dense-q4_k": lambda: engine(fixture("gemma4-dense-q4_k"), chunk=128, lora=lora("gemma4-dense")),
        "lora-moe-f32": lambda: engine(fixture("gemma4-moe-f32"), chunk=16, lora=lora("gemma4-moe")),
        "train-dense-f32": lambda: training_plans(dev, "gemma4-dense", "f32"),
        "train-dense-q4_k": lambda: training_plans(dev, "gemma4-dense", "q4_k"),
        "train-moe-f32": lambda: training_plans(dev, "gemma4-moe", "f32"),
        "diffusion-q8_0": lambda: diffusion("Q8_0"),
        "diffusion-q4_k": lambda: diffusion("Q4_K"),
    }


def sections(lines: list[str]) -> dict:
    """{plan name: its lines} of a listing."""
    out, name = {}, None
    for line in lines:
        if line.startswith("== "):
            name = line[3:].rsplit(":", 1)[0]
            out[name] = []
        elif name is not None:
            out[name].append(line)
    return out


def compare(before: dict, after: dict) -> list[str]:
    """What differs, plan by plan: nothing, the order only (the same dispatches and copies), or the work
    (the lines only one side has)."""
    report = []
    for name in list(before) + [n for n in after if n not in before]:
        a, b = before.get(name), after.get(name)
        if a is None or b is None:
            report.append(f"{name}: only {'after' if a is None else 'before'}")
        elif a != b and Counter(a) == Counter(b):
            report.append(f"{name}: the same {len(a)} lines, in another order")
        elif a != b:
            gone, new = Counter(a) - Counter(b), Counter(b) - Counter(a)
            report.append(f"{name}: {sum(gone.values())} lines only before, {sum(new.values())} only after:")
            report += [f"    - {n} x {line}" for line, n in gone.items()]
            report += [f"    + {n} x {line}" for line, n in new.items()]
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--check", type=Path, help="a directory of earlier listings to compare with")
    ap.add_argument("--only", nargs="*", help="these cases only")
    args = ap.parse_args()
    from pyapp.gpu import get_device
    dev = get_device("native")
    names = Names()
    instrument(dev, names)
    args.out.mkdir(parents=True, exist_ok=True)
    differ = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in cases(dev, Path(tmp)).items():
            if args.only and name not in args.only:
                continue
            names.current = Names()
            names.current.tag(dev.dummy)
            names.current.tag(dev.dummy_out)
            plans = make()
            lines, summary = [], []
            for plan_name, program in plans.items():
                body = program_lines(program)
                lines += [f"== {plan_name}: {dispatches(program)} dispatches"] + body
                summary.append(f"{plan_name}: {dispatches(program)}")
            (args.out / f"{name}.txt").write_text("\n".join(lines) + "\n")
            print(f"{name}: {'; '.join(summary)}", flush=True)
            if args.check is not None:
                report = compare(sections((args.check / f"{name}.txt").read_text().splitlines()), sections(lines))
                differ += bool(report)
                print("  " + ("\n  ".join(report) if report else "identical"), flush=True)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
