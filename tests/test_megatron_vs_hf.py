"""Real Megatron (gloo, 2 and 4 processes) built by the bridge from HF weights gives HF's logits.

Each case launches ``python -m mcore_dapo.harness.logits`` under torchrun on a tiny generated
Qwen3-MoE (or dense Qwen3), compares float32 logits with the HF transformers model computed in
a clean process, and runs a training forward+backward through Megatron's schedules.
"""

import pytest

from mcore_dapo.runtime.launch import torchrun

pytestmark = pytest.mark.cpu_only  # torchrun ranks of real Megatron on one host, gloo

TOL = 1e-4

MOE_CASES = [
    # (world size, layout args)
    (2, ["--ep", "2"]),
    (4, ["--tp", "2", "--ep", "2", "--etp", "1"]),
    (4, ["--tp", "2", "--ep", "2", "--etp", "2"]),
    (4, ["--pp", "2", "--ep", "2"]),
    (4, ["--tp", "2", "--pp", "2"]),
    (4, ["--ep", "4"]),
]


def _check(hf, ref, nproc, args):
    r = torchrun("mcore_dapo.harness.logits", ["--hf-path", str(hf), "--reference", str(ref), "--backward", *args],
                 nproc, timeout=300)
    assert r["world_size"] == nproc
    assert r["max_abs_diff"] < TOL, r
    assert r["top1_agreement"] == 1.0, r
    assert r["grads_finite"] and r["params_with_grad"] > 0.9 * r["params_total"], r
    return r


# both dispatchers for every layout but EP4 (alltoall only: allgather is covered by the others)
CASES = [(n, a, d) for n, a in MOE_CASES for d in ("alltoall", "allgather") if (a, d) != (["--ep", "4"], "allgather")]


@pytest.mark.parametrize("nproc,args,dispatcher", CASES,
                         ids=lambda x: "-".join(x) if isinstance(x, list) else str(x))
def test_moe_layouts_match_hf(tiny_moe, tiny_moe_ref, nproc, args, dispatcher):
    _check(tiny_moe, tiny_moe_ref, nproc, [*args, "--dispatcher", dispatcher])


def test_the_training_loss_is_the_same_in_every_layout(tiny_moe, tiny_moe_ref):
    a = _check(tiny_moe, tiny_moe_ref, 2, ["--ep", "2"])
    b = _check(tiny_moe, tiny_moe_ref, 2, ["--tp", "2"])
    assert abs(a["train_loss"] - b["train_loss"]) < 1e-5


def test_padded_vocab_is_sliced_back(tiny_moe, tiny_moe_ref):
    # 256 tokens padded to a multiple of 96*2 = 384 rows; the padding must not leak into the real logits
    _check(tiny_moe, tiny_moe_ref, 2, ["--tp", "2", "--vocab-divisible-by", "96"])


def test_dense_qwen3_tp2(tiny_dense, tiny_dense_ref):
    _check(tiny_dense, tiny_dense_ref, 2, ["--tp", "2"])
