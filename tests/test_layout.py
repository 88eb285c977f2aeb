"""Layout legality: one-line errors naming the value and what is accepted."""

import pytest

from mcore_dapo.bridge import Layout, load_hf_config
from mcore_dapo.errors import UserError


@pytest.fixture(scope="module")
def cfg(reference_config):
    return load_hf_config(reference_config)


@pytest.mark.parametrize("layout,world", [(Layout(tp=1, ep=8), 32), (Layout(tp=4, ep=8, etp=1), 32),
                                          (Layout(tp=4, pp=2, ep=4), 32), (Layout(tp=2, ep=16, etp=1), 32),
                                          (Layout(ep=128), 128)])
def test_legal_layouts(cfg, layout, world):
    assert layout.validate(cfg, world) is layout


@pytest.mark.parametrize("layout,world,message", [
    (Layout(tp=8), 32, r"tp=8 does not divide the 4 KV groups of the model: accepted TP is one of \[1, 2, 4\]"),
    (Layout(ep=3), 33, r"ep=3 does not divide the 128 experts: accepted EP is one of \[1, 2, 4, 8, 16, 32, 64, 128\]"),
    (Layout(tp=4, pp=2), 12, r"world size 12 is not divisible by TP\*PP\*CP = 8"),
    (Layout(ep=8, pp=2), 8, r"world size 8 is not divisible by ETP\*EP\*PP = 16"),
    (Layout(pp=64), 64, r"pp=64 .* more pipeline stages than the 48 layers"),
    (Layout(tp=0), 8, r"tp=0 is not accepted: a positive integer is"),
    (Layout(etp=5), 5, r"etp=5 does not divide the expert ffn size 768"),
])
def test_illegal_layouts(cfg, layout, world, message):
    with pytest.raises(UserError, match=message) as e:
        layout.validate(cfg, world)
    assert "\n" not in str(e.value)


def test_derived_sizes():
    lay = Layout(tp=4, pp=2, ep=8, etp=1)
    assert lay.dp(32) == 4 and lay.expert_dp(32) == 2 and lay.expert_tp == 1
    assert Layout(tp=2).expert_tp == 2  # Megatron's default ETP is TP


def test_one_table_of_megatron_names():
    import dataclasses
    import inspect

    from megatron.core import parallel_state as ps
    from megatron.core.transformer import TransformerConfig

    from mcore_dapo.bridge.layout import MEGATRON_NAMES

    lay = Layout(tp=2, pp=2, ep=4, etp=1, vpp=2)
    sizes = lay.megatron_sizes()
    assert sizes == {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2,
                     "virtual_pipeline_model_parallel_size": 2, "context_parallel_size": 1,
                     "expert_model_parallel_size": 4, "expert_tensor_parallel_size": 1}
    assert Layout.from_megatron(sizes) == lay
    assert Layout(tp=2).megatron_sizes()["expert_tensor_parallel_size"] == 2  # Megatron's default ETP is TP
    assert Layout.from_megatron({}) == Layout()
    assert Layout.from_megatron({"tensor_model_parallel_size": "4", "context_parallel_size": None}) == Layout(tp=4)
    # the names are those of initialize_model_parallel and of TransformerConfig
    assert set(MEGATRON_NAMES.values()) <= set(inspect.signature(ps.initialize_model_parallel).parameters)
    assert set(MEGATRON_NAMES.values()) <= {f.name for f in dataclasses.fields(TransformerConfig)}


@pytest.mark.parametrize("lay", [Layout(), Layout(tp=2, ep=2), Layout(tp=2, pp=2, ep=4, etp=1, vpp=2), Layout(cp=2, ep=8)])
def test_one_command_line_spelling_round_trips(lay):
    """Layout.add_args / from_args / to_argv: what a launcher writes is what a worker reads back."""
    import argparse

    ap = argparse.ArgumentParser()
    Layout.add_args(ap, ("tp", "pp", "ep", "etp", "cp", "vpp"))
    assert Layout.from_args(ap.parse_args(lay.to_argv())) == lay
    assert Layout.from_args(ap.parse_args([])) == Layout()


def test_command_line_defaults_and_unset():
    import argparse

    ap = argparse.ArgumentParser()
    Layout.add_args(ap, ("tp", "pp", "ep"), ep=2)  # a worker whose default is EP2
    assert Layout.from_args(ap.parse_args([])) == Layout(ep=2)
    ap = argparse.ArgumentParser()
    Layout.add_args(ap, unset=True)  # verify: the checkpoint's layout unless given
    a = ap.parse_args(["--ep", "4"])
    assert (a.tp, a.pp, a.ep, a.etp) == (None, None, 4, None) and Layout.from_args(a) == Layout(ep=4)
    # a worker without --vpp refuses a layout with VPP (argparse's own error), never drops it silently
    with pytest.raises(SystemExit):
        ap.parse_args(Layout(pp=2, vpp=2).to_argv())


def test_hydra_overrides_use_megatrons_names():
    out = Layout(tp=2, ep=8, etp=1).hydra_overrides("actor_rollout_ref.actor.megatron")
    assert out == ["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                   "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1",
                   "actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size=null",
                   "actor_rollout_ref.actor.megatron.context_parallel_size=1",
                   "actor_rollout_ref.actor.megatron.expert_model_parallel_size=8",
                   "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1"]


def test_no_command_spells_a_layout_by_hand():
    """Every CLI, worker and launcher spells a layout through Layout (add_args / to_argv / hydra_overrides):
    no layout flag or Megatron size name is written out elsewhere in the product."""
    import re
    from pathlib import Path

    from mcore_dapo.bridge.layout import MEGATRON_NAMES

    repo = Path(__file__).resolve().parents[1]
    flag = re.compile(r"""["']--(tp|pp|ep|etp|vpp|cp)["']""")
    hydra = re.compile(r"megatron\.(" + "|".join(MEGATRON_NAMES.values()) + ")=")
    found = []
    for path in [*(repo / "mcore_dapo").rglob("*.py"), *(repo / "tools").rglob("*.py")]:
        if path.name == "layout.py" and path.parent.name == "bridge":
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if flag.search(line) or hydra.search(line):
                found.append(f"{path.relative_to(repo)}:{i}: {line.strip()}")
    assert not found, "\n".join(found)
