"""Real Megatron (gloo, 2 and 4 processes) built by the bridge from HF weights gives HF's logits and HF's
gradients.

Each case launches ``python -m mcore_dapo_checks.logits`` under torchrun on a tiny generated
Qwen3-MoE (or dense Qwen3), compares float32 logits with the HF transformers model computed in
a clean process, and runs a training forward+backward through Megatron's schedules, with Megatron's
DDP and ``finalize_model_grads`` as verl's engine trains. Every parameter's gradient, routers
included, is brought to its HF name by the weight exporter and compared with the HF model's gradient
of the same loss (next-token cross-entropy, no auxiliary loss) computed in the clean process.

The batch is 4 right-padded sequences of 15, 11, 6 and 9 tokens in 16 positions (``mcore_dapo_checks/tiny.py``'s
``tiny_batch``: 14, 10, 5 and 8 loss tokens). Each data-parallel rank runs its own share of them (DP2: the first
two and the last two, 24 and 13 loss tokens; DP4: one each), so a data-parallel reduction that is skipped, a
token exchanged with the wrong source rank, or a per-rank normalisation moves the result. The loss is verl's
token-mean over the global batch's 37 loss tokens; the HF reference computes it over the union of the ranks'
sequences, with the attention mask; logits are compared on each rank's real tokens.
"""

import subprocess
import sys

import pytest

from mcore_dapo.runtime.launch import torchrun

# torchrun ranks of real Megatron through the device adapter alone (gloo on the CPU; on an accelerator host one
# device a rank, its backend and layer spec): each case is marked with its number of ranks (tests/conftest.py)

TOL = 1e-4
# Gradients, float32: per tensor, max |g_megatron - g_hf| / max |g_hf|. Both sides compute the same
# arithmetic in another order (sharded GEMMs, all-to-all token order, TP/DP reductions, the export's
# gathers): fp32 rounding (unit roundoff 6e-8) through 4 layers and a sum over 37 loss tokens, measured at
# 1.2e-6 to 1.9e-6 here. A gradient reduction that is missing, doubled or mis-scaled moves a tensor by a
# factor (relative error ~1e-1 and up), which 1e-4 catches with three orders of magnitude to spare.
GRAD_TOL = 1e-4
LOSS_TOL = 1e-5  # the loss ~5.6: fp32 rounding of a mean over 37 tokens

MOE_CASES = [
    # (world size, layout args)
    (2, ["--ep", "2"]),
    (4, ["--tp", "2", "--ep", "2", "--etp", "1"]),
    (4, ["--tp", "2", "--ep", "2", "--etp", "2"]),
    (4, ["--pp", "2", "--ep", "2"]),
    (4, ["--tp", "2", "--pp", "2"]),
    (4, ["--ep", "4"]),
]

# (data-parallel, expert-data-parallel) size of each layout, worked out by hand: DP = world / (TP * PP),
# expert DP = world / (PP * EP * ETP), ETP defaulting to TP. TP2·EP2·ETP1 is the one with an expert DP of 2:
# each expert's gradient is reduced over 2 ranks that ran different sequences
DATA_PARALLEL = {
    (2, ("--ep", "2")): (2, 1),
    (4, ("--tp", "2", "--ep", "2", "--etp", "1")): (2, 2),
    (4, ("--tp", "2", "--ep", "2", "--etp", "2")): (2, 1),
    (4, ("--pp", "2", "--ep", "2")): (2, 1),
    (4, ("--tp", "2", "--pp", "2")): (1, 1),
    (4, ("--ep", "4")): (4, 1),
    (2, ("--tp", "2")): (1, 1),
    (2, ("--pp", "2", "--vpp", "2")): (1, 1),
}
LAYOUT_FLAGS = ("--tp", "--pp", "--ep", "--etp", "--vpp")
BATCH = 4
LOSS_TOKENS = [14, 10, 5, 8]  # 15, 11, 6 and 9 tokens, each predicting the next but the last


_launched = {}  # the launches of this file by their arguments: a layout another test launched is not launched again


def _check(hf, ref, nproc, args):
    key = (str(hf), str(ref), nproc, tuple(args))
    if key not in _launched:
        _launched[key] = torchrun("mcore_dapo_checks.logits",
                                  ["--hf-path", str(hf), "--reference", str(ref), "--backward", *args], nproc,
                                  timeout=300)
    r = _launched[key]
    assert r["world_size"] == nproc
    layout = tuple(x for flag, value in zip(args[::2], args[1::2]) if flag in LAYOUT_FLAGS for x in (flag, value))
    dp, edp = DATA_PARALLEL[(nproc, layout)]
    assert (r["data_parallel"], r["expert_data_parallel"]) == (dp, edp), r
    # each data-parallel rank ran its own contiguous share of the batch, and the shares' loss tokens differ
    share = BATCH // dp
    assert r["rows_by_dp_rank"] == [list(range(i * share, (i + 1) * share)) for i in range(dp)], r
    assert r["loss_tokens_by_dp_rank"] == [sum(LOSS_TOKENS[i * share:(i + 1) * share]) for i in range(dp)], r
    # one model per dispatcher where the launch built several (--dispatcher alltoall,allgather)
    for one in r.get("by_dispatcher", {"": r}).values():
        assert one["max_abs_diff"] < TOL, one
        assert one["top1_agreement"] == 1.0, one
        assert abs(one["train_loss"] - one["reference_loss"]) < LOSS_TOL, one
        # every HF tensor's gradient compared, none the exporter yields is unknown to HF
        assert one["grads_compared"] == one["grads_reference"] and not one["grads_not_in_reference"], one
        assert one["grads_finite"] and one["grad_max_rel_err"] < GRAD_TOL, one
    return r


# both dispatchers for every layout but EP4 (alltoall only: allgather is covered by the others), the two models
# built one after the other in the layout's one launch
BOTH_DISPATCHERS = "alltoall,allgather"
CASES = [pytest.param(n, a, "alltoall" if a == ["--ep", "4"] else BOTH_DISPATCHERS, marks=pytest.mark.ranks(n))
         for n, a in MOE_CASES]


@pytest.mark.parametrize("nproc,args,dispatcher", CASES,
                         ids=lambda x: "-".join(x) if isinstance(x, list) else str(x).replace(",", "+"))
def test_moe_layouts_match_hf(tiny_moe, tiny_moe_ref, nproc, args, dispatcher):
    r = _check(tiny_moe, tiny_moe_ref, nproc, [*args, "--dispatcher", dispatcher])
    built = r["by_dispatcher"] if "by_dispatcher" in r else {r["dispatcher"]: r}
    assert {d: one["dispatcher"] for d, one in built.items()} == {d: d for d in dispatcher.split(",")}


@pytest.mark.ranks(2)
def test_the_training_loss_is_the_same_in_every_layout(tiny_moe, tiny_moe_ref):
    a = _check(tiny_moe, tiny_moe_ref, 2, ["--ep", "2", "--dispatcher", BOTH_DISPATCHERS])  # the EP2 case's launch
    b = _check(tiny_moe, tiny_moe_ref, 2, ["--tp", "2"])
    assert abs(a["by_dispatcher"]["alltoall"]["train_loss"] - b["train_loss"]) < 1e-5
    assert abs(a["by_dispatcher"]["allgather"]["train_loss"] - b["train_loss"]) < 1e-5


PADDED_VOCAB = 384  # 256 tokens padded to a multiple of 96*2 = 192


@pytest.fixture(scope="module")
def tiny_moe_ref_padded(tiny_moe, tmp_path_factory):
    """The HF reference whose training loss runs over 384 logits, the rows past the vocabulary at zero: what
    Megatron's output layer, padded with zero rows, computes (its cross-entropy does not mask the padding)."""
    out = tmp_path_factory.mktemp("ref") / "ref-padded.pt"
    subprocess.run([sys.executable, "-m", "mcore_dapo_checks.tiny", "reference", str(tiny_moe), str(out),
                    "--padded-vocab", str(PADDED_VOCAB)], check=True, capture_output=True, text=True)
    return out


@pytest.mark.ranks(2)
def test_padded_vocab_is_sliced_back(tiny_moe, tiny_moe_ref_padded):
    # the padding must not leak into the real logits, nor into the real rows' gradients
    _check(tiny_moe, tiny_moe_ref_padded, 2, ["--tp", "2", "--vocab-divisible-by", "96"])


@pytest.mark.ranks(2)
def test_dense_qwen3_tp2(tiny_dense, tiny_dense_ref):
    _check(tiny_dense, tiny_dense_ref, 2, ["--tp", "2"])


# The interleaved schedule (VPP): the 4 sequences are 4 micro-batches (DP 1), twice PP's 2 stages, so that the
# schedule has a steady state, in which a stage sends an activation and a gradient to the one other stage in one
# step (batched p2p, megatron-core's default, swaps what such a step receives: this layout's gradients were off by
# a factor)
VPP_BATCH = str(BATCH)


@pytest.mark.ranks(2)
def test_pp2_vpp2_matches_hf(tiny_moe, tiny_moe_ref):
    # 4 layers: one a virtual stage
    r = _check(tiny_moe, tiny_moe_ref, 2, ["--pp", "2", "--vpp", "2"])
    assert r["layout"] == "TP1 PP2 EP1 ETP1 VPP2"


@pytest.fixture(scope="module")
def tiny_moe_8_layers(tmp_path_factory):
    from mcore_dapo_checks.tiny import make_tiny_model

    hf = make_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-qwen3-moe-8", seed=0, num_hidden_layers=8)
    ref = hf.parent / "ref-4mb.pt"
    subprocess.run([sys.executable, "-m", "mcore_dapo_checks.tiny", "reference", str(hf), str(ref),
                    "--batch", VPP_BATCH], check=True, capture_output=True, text=True)
    return hf, ref


@pytest.mark.ranks(2)
def test_pp2_vpp2_uneven_stages_match_hf(tiny_moe_8_layers):
    # the A2 recipe's shape (PP2 x VPP2, a heavier first stage) at 8 layers: 6 in the first stage (two virtual
    # stages of 3), the last stage the rest (two of 1). At PP2 only the first stage's count is given: with the
    # last's too there is no middle stage, and megatron-core divides by their number (0.12.1:
    # TransformerConfig.__post_init__; 0.16.1: get_transformer_layer_offset with VPP)
    hf, ref = tiny_moe_8_layers
    _check(hf, ref, 2, ["--pp", "2", "--vpp", "2", "--first", "6"])


def test_the_reference_batch_is_right_padded_with_different_lengths(tiny_moe_ref):
    import torch

    ref = torch.load(tiny_moe_ref)
    assert ref["tokens"].shape == (BATCH, 16)
    assert ref["attention_mask"].sum(1).tolist() == [15, 11, 6, 9]
    assert ref["loss_mask"].sum(1).tolist() == LOSS_TOKENS
    for row, n in enumerate([15, 11, 6, 9]):
        assert ref["attention_mask"][row].tolist() == [1] * n + [0] * (16 - n)
        assert ref["loss_mask"][row].tolist() == [1] * (n - 1) + [0] * (17 - n)
        assert ref["tokens"][row, n:].eq(0).all()  # the pad id
        # each real token but the last labelled with the next
        assert ref["labels"][row, : n - 1].tolist() == ref["tokens"][row, 1:n].tolist()
