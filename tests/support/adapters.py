"""Adapter files as the other tools see them: one written by gguf-py as llama.cpp's converter writes it (with what a
test changes), and what llama.cpp's adapter loader (src/llama-adapter.cpp) would say of a file, rule by rule."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest


def write_adapter(path: Path, tensors: dict, arch="gemma4", general_type="adapter", adapter_type="lora",
                  alpha: float | None = 8.0, alpha_f64=False, extra=None) -> Path:
    """An adapter GGUF written by gguf-py, as llama.cpp's converter writes one, with what a test changes."""
    gguf = pytest.importorskip("gguf")
    w = gguf.GGUFWriter(str(path), arch=arch)
    if general_type is not None:
        w.add_type(general_type)
    if adapter_type is not None:
        w.add_string("adapter.type", adapter_type)
    if alpha is not None:
        (w.add_float64 if alpha_f64 else w.add_float32)("adapter.lora.alpha", alpha)
    for fn in extra or ():
        fn(w, gguf)
    for name, arr in tensors.items():
        if isinstance(arr, tuple):            # (raw bytes as uint8 array, ggml type): a quantized tensor
            w.add_tensor(name, arr[0], raw_dtype=arr[1])
        else:
            w.add_tensor(name, np.ascontiguousarray(arr, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def llama_cpp_load_errors(adapter, base) -> list[str]:
    """What llama.cpp's adapter loader would say of this file (gguf-py readers of the adapter and base),
    rule by rule; [] if it loads. gguf_get_val_f32 asserts the FLOAT32 type (ggml/src/gguf.cpp)."""
    gguf = pytest.importorskip("gguf")
    V = gguf.GGUFValueType
    f = adapter.fields

    def text(key):
        return f[key].contents() if key in f and f[key].types == [V.STRING] else ""

    errors = []
    if text("general.type") != "adapter":
        errors.append("general.type")
    if text("general.architecture") != base.fields["general.architecture"].contents():
        errors.append("arch mismatch")
    if text("adapter.type") != "lora":
        errors.append("adapter.type")
    if "adapter.lora.alpha" in f and f["adapter.lora.alpha"].types != [V.FLOAT32]:
        errors.append("alpha not FLOAT32 (abort)")
    base_ne = {t.name: [int(x) for x in t.shape] for t in base.tensors}
    pairs = {}
    for t in adapter.tensors:
        for i, suffix in enumerate((".lora_a", ".lora_b")):
            if t.name.endswith(suffix):
                pairs.setdefault(t.name[:-7], [None, None])[i] = [int(x) for x in t.shape]
                break
        else:
            if not t.name.endswith("_norm.weight"):
                errors.append(f"{t.name}: unexpected suffix")
    for name, (a, b) in pairs.items():
        if a is None or b is None:
            errors.append(f"{name}: missing one component")
        elif name not in base_ne:
            errors.append(f"{name}: not in base model")
        elif name.endswith("token_embd.weight"):
            errors.append(f"{name}: token_embd (tied head for gemma4: llama.cpp aborts at graph time)")
        elif base_ne[name][0] != a[0] or base_ne[name][1] != b[1]:
            errors.append(f"{name}: incorrect shape")
        elif a[1] != b[0]:
            errors.append(f"{name}: lora_a not transposed")
    return errors
