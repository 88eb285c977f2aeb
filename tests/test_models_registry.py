"""The model registry (bridge/models): one spec per HF architecture is all the plugin's architecture check,
the vLLM receiver's check and the config reader know; an unknown architecture is one line. No Megatron,
no process."""

import dataclasses
import json

import pytest

from mcore_dapo.bridge import Bridge, Layout
from mcore_dapo.bridge.models import architectures, get_model, register, unregister
from mcore_dapo.bridge.models.qwen3 import SPEC as QWEN3
from mcore_dapo.bridge.models.qwen3.hf_config import parse_qwen3_config
from mcore_dapo.errors import UserError
from mcore_dapo_checks.tiny import TINY_MOE

FAKE_ARCH = "TinyFakeForCausalLM"


def _parse_fake(raw: dict):
    """A second model that reads like Qwen3-MoE (its table, sizes and settings too), under its own names."""
    return dataclasses.replace(parse_qwen3_config({**raw, "model_type": "qwen3_moe"}), model_type="tiny_fake")


@pytest.fixture
def fake_model():
    spec = dataclasses.replace(QWEN3, name="tiny_fake", architectures=(FAKE_ARCH,), model_types=("tiny_fake",),
                               parse_config=_parse_fake)
    register(spec)
    try:
        yield spec
    finally:
        unregister(spec)
    assert FAKE_ARCH not in architectures()


def _fake_config() -> dict:
    return {**TINY_MOE, "model_type": "tiny_fake", "architectures": [FAKE_ARCH]}


def test_the_built_in_architectures():
    assert architectures() == ("Qwen3MoeForCausalLM", "Qwen3ForCausalLM")
    assert get_model("Qwen3ForCausalLM") is QWEN3
    assert get_model(TINY_MOE) is QWEN3
    assert Bridge(parse_qwen3_config(TINY_MOE)).spec is QWEN3


def test_a_registered_architecture_is_found_by_the_plugin_and_the_vllm_receiver(fake_model, tmp_path):
    from mcore_dapo.resharding.vllm_target import expected_weights
    from mcore_dapo.verl_plugin.config_checks import check_architecture

    raw = _fake_config()
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert FAKE_ARCH in architectures()
    assert get_model(FAKE_ARCH) is fake_model and get_model(raw) is fake_model
    cfg = check_architecture(tmp_path)
    assert cfg.model_type == "tiny_fake" and get_model(cfg) is fake_model
    assert Bridge(cfg, Layout()).spec is fake_model
    assert expected_weights(raw) == dict(Bridge(parse_qwen3_config(TINY_MOE), Layout()).hf_shapes())


def test_an_unknown_architecture_is_one_line(tmp_path):
    from mcore_dapo.resharding.vllm_target import expected_weights
    from mcore_dapo.verl_plugin.config_checks import check_architecture

    supported = "Qwen3MoeForCausalLM, Qwen3ForCausalLM"
    with pytest.raises(UserError) as e:
        get_model("LlamaForCausalLM")
    assert str(e.value) == f"architecture LlamaForCausalLM is not supported by mcore_dapo: supported are {supported}"
    with pytest.raises(UserError, match=r"^model_type='llama' is not supported by mcore_dapo: supported are Qwen3"):
        get_model({"model_type": "llama"})
    raw = _fake_config()  # not registered here
    with pytest.raises(UserError) as e:
        get_model(raw)
    assert str(e.value) == f"architecture {FAKE_ARCH} is not supported by mcore_dapo: supported are {supported}"
    with pytest.raises(UserError) as e:
        expected_weights({**TINY_MOE, "architectures": [FAKE_ARCH]})
    assert str(e.value) == (f"the rollout engine's model is {FAKE_ARCH}; the weight sync serves {supported}; "
                            "nothing was written")
    (tmp_path / "config.json").write_text(json.dumps({**TINY_MOE, "architectures": [FAKE_ARCH]}))
    with pytest.raises(UserError) as e:
        check_architecture(tmp_path)
    assert str(e.value) == f"architecture ['{FAKE_ARCH}'] is not supported by mcore_dapo: supported are {supported}"


def test_an_architecture_is_registered_once(fake_model):
    with pytest.raises(ValueError, match=f"architecture {FAKE_ARCH} is registered already"):
        register(dataclasses.replace(fake_model, name="other"))


def test_model_knowledge_is_asked_of_get_model_outside_the_models_folder():
    """Expert slicing, the router's name and the rest of a family's knowledge are the spec's: no module outside
    bridge/models/ imports a model's folder or spells its router's module name (text of every module)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "mcore_dapo"
    found = []
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root.parent).as_posix()
        if rel.startswith("mcore_dapo/bridge/models/"):
            continue
        for i, line in enumerate(f.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if "bridge.models.qwen3" in code or '"mlp.gate"' in code or "'mlp.gate'" in code:
                found.append(f"{rel}:{i}: {line.strip()}")
    assert not found, "\n".join(found)
