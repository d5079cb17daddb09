"""The family registry (pyapp.families): a file's family found from its architecture, each family's
declaration complete (no GPU: the engine's use of it is tested by the engine and diffusion tests)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from support.paths import ROOT
from pyapp.gguf import read_gguf

FIX = ROOT / "tests" / "fixtures"


def test_the_registry_finds_each_family_by_its_architecture(diffusion_gguf):
    from pyapp.families import DIFFUSION_GEMMA, GEMMA4, family_for, model_config
    g = read_gguf(FIX / "gemma4-moe-f32.gguf")
    assert family_for(g) is GEMMA4 and family_for(g.metadata) is GEMMA4
    assert type(model_config(g)) is GEMMA4.config
    d = read_gguf(diffusion_gguf("f32"))
    assert family_for(d) is DIFFUSION_GEMMA and type(model_config(d)) is DIFFUSION_GEMMA.config
    assert (GEMMA4.architecture, DIFFUSION_GEMMA.architecture) == ("gemma4", "diffusion-gemma")


def test_a_file_of_no_family_is_refused_by_gemma4s_config():
    from pyapp.families import GEMMA4, family_for, model_config
    from pyapp.model.config import ConfigError
    llama = SimpleNamespace(metadata={"general.architecture": "llama"}, tensors={})
    assert family_for(llama) is GEMMA4
    with pytest.raises(ConfigError, match="architecture is 'llama', not 'gemma4': this app runs Gemma 4 models only"):
        model_config(llama)


def test_every_family_declares_its_pieces():
    from pyapp.families import FAMILIES
    from pyapp.model.gemma4 import Gemma4
    from pyapp.runtime.loaded import LoadedModel
    from pyapp.runtime.runner import Runner
    from pyapp.runtime.state import State
    assert len({f.architecture for f in FAMILIES}) == len({f.name for f in FAMILIES}) == len(FAMILIES)
    for f in FAMILIES:
        assert f.config.from_gguf and issubclass(f.runner, Runner) and issubclass(f.runner.state_class, State)
        assert issubclass(f.forward, Gemma4)
        assert f.engine is None or issubclass(f.engine, LoadedModel)
        assert hasattr(f.reference(), "__init__")        # the numpy oracle's class, imported when asked
    by_name = {f.name: f for f in FAMILIES}
    assert by_name["Gemma 4"].engine is None and by_name["Gemma 4"].trains      # Engine: token by token
    assert by_name["DiffusionGemma"].engine.__name__ == "DiffusionEngine" and not by_name["DiffusionGemma"].trains
