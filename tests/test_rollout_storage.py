"""The storage guard of weight syncs into vLLM (patching/verl_any/rollout_storage_guard.py) and the expert map of
vLLM's CPU MoE kernel under expert parallelism (patching/vllm_cpu/expert_map.py), on real tensors; the trainer run
that exercises both in vLLM's CPU build is tests/test_verl_trainer.py's ``vllm_run``."""

import types

import pytest
import torch

from mcore_dapo.errors import UserError
from mcore_dapo.patching.verl_any.rollout_storage_guard import check_moved, moved, runs_graphs, storage_map


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))


def _load_in_place(model, tensors):
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(tensors[name])


def _load_rebinding(model, tensors, which="0.weight"):
    _load_in_place(model, tensors)
    module, attr = which.split(".")
    setattr(model[int(module)], attr, torch.nn.Parameter(tensors[which].clone()))


def test_a_sync_in_place_keeps_every_address_and_a_rebinding_one_is_named():
    model = _model()
    new = {n: torch.randn_like(p) for n, p in model.named_parameters()}
    before = storage_map([model])
    _load_in_place(model, new)
    assert moved(before, storage_map([model])) == []
    # the mutation: a loader that rebinds one parameter
    before = storage_map([model])
    _load_rebinding(model, new)
    assert moved(before, storage_map([model])) == ["0.0.weight"]


def test_graph_mode_refuses_a_rebound_parameter_in_one_line_and_eager_mode_goes_on():
    with pytest.raises(UserError) as e:
        check_moved(["0.model.layers.0.mlp.experts.w13_weight"], graphs=True)
    assert "\n" not in str(e.value) and "w13_weight" in str(e.value) and "enforce_eager=True" in str(e.value)
    check_moved(["0.model.layers.0.mlp.experts.w13_weight"], graphs=False)
    check_moved([], graphs=True)


def test_graphs_are_read_from_vllms_own_compilation_config():
    pytest.importorskip("vllm")
    from vllm.config import CompilationConfig

    graphs = types.SimpleNamespace(compilation_config=CompilationConfig(cudagraph_mode="FULL_DECODE_ONLY"))
    eager = types.SimpleNamespace(compilation_config=CompilationConfig(cudagraph_mode="NONE"))
    assert runs_graphs(graphs) and not runs_graphs(eager)


def test_expert_map_routes_to_local_experts_and_zeroes_the_others():
    from mcore_dapo.patching.vllm_cpu.expert_map import local_routes

    # 8 experts over 2 ranks, this rank holds 4..7 (vLLM's linear placement: -1 elsewhere)
    expert_map = torch.tensor([-1, -1, -1, -1, 0, 1, 2, 3], dtype=torch.int32)
    ids = torch.tensor([[0, 5], [7, 4], [3, 2]], dtype=torch.int32)
    weights = torch.tensor([[0.6, 0.4], [0.7, 0.3], [0.5, 0.5]])
    w, i = local_routes(weights, ids, expert_map)
    assert i.dtype == ids.dtype and i.tolist() == [[0, 1], [3, 0], [0, 0]]
    assert torch.equal(w, torch.tensor([[0.0, 0.4], [0.7, 0.3], [0.0, 0.0]]))
    # every id a valid local index, whatever the routes
    assert int(i.max()) < 4 and int(i.min()) >= 0
