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
