"""Rollout resharding with real Megatron under torchrun (gloo): one launch per layout, many checks each.

Each launch runs ``python -m mcore_dapo_checks.check_weight_sync`` on the tiny Qwen3-MoE: bit-exact
export against the checkpoint (large buckets, small buckets, bf16), a sync into an HF
transformers model (logits against the HF reference), receivers of the wrong model refused
without a write, a corrupting receiver caught by checksums, then an Adam step on the Megatron
side and a second sync into the same receiver (logits against the trained Megatron model).
"""

from pathlib import Path

import pytest

from mcore_dapo.runtime.launch import torchrun

pytestmark = pytest.mark.cpu_only  # torchrun ranks of real Megatron on one host, gloo

LAYOUTS = {
    "tp1-ep2": (2, ["--ep", "2"]),
    "tp2-ep2-padded-vocab": (4, ["--tp", "2", "--ep", "2", "--vocab-divisible-by", "96"]),
    "pp2-ep2": (4, ["--pp", "2", "--ep", "2"]),
    "tp2-etp1-ep2": (4, ["--tp", "2", "--ep", "2", "--etp", "1"]),
}
VOCAB = 256
LOGIT_TOL = 1e-5
# in the Ascend stack's selection too: the layout classes whose Megatron modules differ (TP with ETP1 under EP, PP);
# TP1·EP2 and the padded vocabulary take the same modules on that line (the exporter's own code is the same on both)
BOTH_STACKS = ("tp2-etp1-ep2", "pp2-ep2")


def _cases(ids):
    return [pytest.param(i, marks=pytest.mark.both_stacks) if i in BOTH_STACKS else i for i in ids]


@pytest.fixture(scope="module", params=_cases(LAYOUTS))
def run(request, tiny_moe, tiny_moe_ref):
    nproc, args = LAYOUTS[request.param]
    r = torchrun("mcore_dapo_checks.check_weight_sync",
                 ["--hf-path", str(tiny_moe), "--reference", str(tiny_moe_ref), "--train", *args], nproc, timeout=300)
    return {**r, "case": request.param}


def _exports(r):
    return {k: v for k, v in r.items() if k.startswith("export_")}


def test_export_is_bit_exact_with_every_hf_name(run):
    for label, e in _exports(run).items():
        assert e["mismatches"] == 0, (label, e["first_mismatch"])
        assert e["names_ok"], label
    assert run["export_big"]["tensors"] == run["export_small"]["tensors"] == 135
    assert run["export_bf16"]["bytes"] * 2 == run["export_big"]["bytes"]
    # vocab padding (384 rows in the padded layout) is dropped: the shapes compared above are 256 rows
    assert (run["padded_vocab"] > VOCAB) == ("padded-vocab" in run["case"])


def test_collectives_grow_with_buckets_not_tensors(run):
    big, small = run["export_big"], run["export_small"]
    groups = 1 + ("TP2" in run["layout"]) + ("PP2" in run["layout"])  # expert (+ tp) (+ pp)
    for e in (big, small):
        assert e["collectives"]["total"] == e["planned_collectives"]
        assert e["collectives"]["total"] <= e["buckets"] * groups
    assert big["collectives"]["total"] <= groups * big["buckets"] <= 2 * groups
    assert small["buckets"] >= 5 * big["buckets"] and small["collectives"]["total"] > big["collectives"]["total"]
    assert big["collectives"]["total"] < big["per_tensor_collectives"] / 10


def test_peak_memory_is_about_two_buckets(run):
    pad = run["padded_vocab"] / VOCAB
    for label, e in _exports(run).items():
        assert e["peak_buffer_bytes"] <= 2 * e["max_bucket_bytes"] * pad, label


def test_pp_stages_can_own_their_tensors_without_broadcast(run):
    assert ("export_owner" in run) == ("PP2" in run["layout"])
    owner = run.get("export_owner")
    if owner is None:
        return
    assert owner["stages_partition_names"] and owner["mismatches"] == 0
    assert "pp" not in owner["collectives"]["by_group"]


def test_receiver_gets_the_checkpoint_logits(run):
    assert run["receiver_vs_reference"] < LOGIT_TOL
    assert run["sync1"]["tensors"] == 135


def test_trained_weights_reach_the_receiver_on_a_second_sync(run):
    assert run["changed_fraction"] > 0.9  # the optimizer step moved (almost) every tensor
    assert run["trained_receiver_vs_megatron"] < LOGIT_TOL
    assert run["sync2"]["collectives"] == run["sync1"]["collectives"]  # the cached plan, reused


def test_wrong_receiver_is_refused_before_any_write(run):
    shape = run["mismatch"]["fewer_experts"]
    assert shape["unchanged"]
    assert "'model.layers.0.mlp.gate.weight' has shape [8, 64] in the trainer but [4, 64]" in shape["error"]
    name = run["mismatch"]["fewer_layers"]
    assert name["unchanged"]
    assert "'model.layers.3.input_layernorm.weight' [64] sent by the trainer does not exist" in name["error"]


def test_checksums_catch_a_corrupting_receiver(run):
    err = run["faulty"]["error"]
    assert err and "1 tensor(s) differ" in err and "'model.layers.1.mlp.experts.5.up_proj.weight'" in err


def _checkpoint_bytes(hf_dir) -> int:
    from safetensors import safe_open

    total = 0
    for f in sorted(Path(hf_dir).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for k in st.keys():
                t = st.get_tensor(k)
                total += t.numel() * t.element_size()
    return total


@pytest.mark.parametrize("nproc,args", [(2, ["--ep", "2"]), pytest.param(4, ["--pp", "2", "--ep", "2"],
                                                                       marks=pytest.mark.both_stacks)],
                         ids=["ep2", "pp2-ep2"])
def test_sync_bench_cli(tiny_moe, capsys, nproc, args):
    import json

    from test_resharding_receiver import sync_bench_cli

    from mcore_dapo_checks.bench_weight_sync import render

    assert sync_bench_cli(["--hf-path", str(tiny_moe), *args, "--bucket-mb", "0.05", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["bit_exact"] and r["nproc"] == nproc and r["tensors"] == 135
    groups = 1 + ("--pp" in args)
    assert r["collectives"] <= groups * r["buckets"] and r["collectives"] < r["per_tensor_collectives"]
    # the bytes synced are the checkpoint's, each tensor once (read here with safetensors itself; the checkpoint's
    # fp32 is the sync's dtype): a tensor sent twice, or a rank's share counted as the whole, is off
    assert r["dtype"] == "fp32" and r["bytes"] == _checkpoint_bytes(tiny_moe)
    # one timing per --repeat (default 2), each a measured duration; the limits measured, not 0
    assert len(r["seconds_all"]) == 2 and all(t > 0 for t in r["seconds_all"])
    assert r["memcpy_gbps"] > 0 and r["flat_seconds"] > 0
    assert "bit-exact vs checkpoint  yes" in render(r)
