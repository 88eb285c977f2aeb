"""The trainer audit's optimizer settings come from the launch, not from the engine (mcore_dapo_checks/audit_reference.py).

The reference's Adam settings and learning rates are what the launch scripts' overrides configure: the overrides
(:func:`mcore_dapo_checks.tiny_dapo.overrides`, the trainer run's) composed with verl's ``ppo_trainer`` config
and mapped by verl's own ``init_megatron_optim_config``; the engine's are compared with them. Each check here
is shown to fail on a mutated config. The weights the audit compares cannot tell a weight decay of 0.1 from 0
nor a clip of 1 from 10 in a few updates (Adam's step is nearly independent of the gradient's scale, and the
decay moves a weight by lr * wd * |w| an update, far below a bf16 step), so the settings comparison is what
catches those; a gradient scaled by 2 is caught by the grad-norm comparison. In one process: verl's config
composed by Hydra, the tiny HF model's real gradients, no Megatron process, no Ray.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

pytest.importorskip("verl")

# what the engine's audit records for the launch scripts' settings (mcore_dapo_checks/audit.optimizer_settings), and
# the learning rates of the trainer run's 4 updates (tests/test_verl_trainer.py asserts the same)
ENGINE = {"adam_beta1": 0.9, "adam_beta2": 0.999, "adam_eps": 1e-08, "weight_decay": 0.1, "clip_grad": 1.0,
          "group_weight_decays": [0.0, 0.1]}
ENGINE_LRS = [0.0, 1e-3, 1e-3, 1e-3]
A = "actor_rollout_ref.actor.optim"


@pytest.fixture(scope="module")
def launch() -> list[str]:
    """The trainer run's overrides (tests/test_verl_trainer.py's: 4 steps, the H100 script's layout class)."""
    from mcore_dapo_checks.tiny_dapo import overrides

    files = {"model": Path("/nonexistent/model"), "train": Path("/nonexistent/train.parquet"),
             "val": Path("/nonexistent/val.parquet")}
    return overrides(files, Path("/nonexistent/work"), 4, layout="h100")


def test_the_launch_configures_the_scripts_settings_and_megatrons_defaults(launch):
    from mcore_dapo_checks.audit_reference import configured_optimizer, optimizer_failures, scheduled_lr

    s = configured_optimizer(launch)
    # configs/dapo/common.sh: weight_decay=0.1, clip_grad=1.0, lr_warmup_steps=10 and lr=1e-6, which the CPU run
    # changes to 1 and 1e-3 (tiny_dapo.cpu_changes); verl's optim/megatron.yaml: constant decay, min_lr 0, warm-up
    # from 0; Megatron's OptimizerConfig defaults (megatron/core/optimizer/optimizer_config.py), which verl's
    # mapping leaves in place: betas 0.9, 0.999, eps 1e-8; the decay over the run's 4 steps
    assert {k: s[k] for k in ("adam_beta1", "adam_beta2", "adam_eps", "weight_decay", "clip_grad", "lr", "min_lr",
                              "lr_warmup_init", "lr_warmup_steps", "lr_decay_steps", "lr_decay_style")} == {
        "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_eps": 1e-08, "weight_decay": 0.1, "clip_grad": 1.0,
        "lr": 1e-3, "min_lr": 0.0, "lr_warmup_init": 0.0, "lr_warmup_steps": 1, "lr_decay_steps": 4,
        "lr_decay_style": "constant"}
    assert [scheduled_lr(s, k) for k in range(4)] == ENGINE_LRS
    for k, lr in enumerate(ENGINE_LRS):
        assert optimizer_failures(s, ENGINE, scheduled_lr(s, k), lr) == []


# each: a change of the launch's config and the settings the comparison must name (the engine's record unchanged)
MUTATIONS = [
    (f"{A}.weight_decay=0.0", {"weight_decay", "group_weight_decays"}),
    (f"{A}.clip_grad=10.0", {"clip_grad"}),
    (f"{A}.lr_warmup_steps=2", {"lr"}),  # update 1 at lr 5e-4, the engine's 1e-3
    (f"{A}.lr=2e-3", {"lr"}),
    (f"+{A}.override_optimizer_config.adam_beta2=0.95", {"adam_beta2"}),
    (f"{A}.betas=[0.9,0.95]", {"betas"}),  # verl's mapping does not read optim.betas: Megatron would run 0.999
]


@pytest.mark.parametrize("change,named", MUTATIONS,
                         ids=["weight_decay", "clip_grad", "warmup", "lr", "override_adam_beta2", "betas"])
def test_a_setting_that_differs_from_the_launch_is_a_failure(launch, change, named):
    from mcore_dapo_checks.audit_reference import configured_optimizer, optimizer_failures, scheduled_lr

    s = configured_optimizer([*launch, change])
    failures = [f for k, lr in enumerate(ENGINE_LRS) for f in optimizer_failures(s, ENGINE, scheduled_lr(s, k), lr)]
    assert {f.split(":")[0] for f in failures} == named, failures


def test_parameter_groups_that_decay_otherwise_are_a_failure(launch):
    from mcore_dapo_checks.audit_reference import configured_optimizer, optimizer_failures

    s = configured_optimizer(launch)
    # Megatron's default weight decay (0.01) applied by the groups while the config says 0.1
    failures = optimizer_failures(s, {**ENGINE, "group_weight_decays": [0.0, 0.01]}, 1e-3, 1e-3)
    assert len(failures) == 1 and failures[0].startswith("group_weight_decays:"), failures


def test_the_schedule_is_megatrons(launch):
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    from mcore_dapo_checks.audit_reference import scheduled_lr

    s = {"lr": 1e-3, "min_lr": 1e-4, "lr_warmup_init": 0.0, "lr_warmup_steps": 2, "lr_decay_steps": 6}
    # by hand: warm-up 0, lr/2, lr; then min + (1 - (k - 2) / 4) * (lr - min) to k = 6; min after
    linear = [0.0, 5e-4, 1e-3, 7.75e-4, 5.5e-4, 3.25e-4, 1e-4, 1e-4]
    assert [scheduled_lr({**s, "lr_decay_style": "linear"}, k) for k in range(8)] == pytest.approx(linear, abs=1e-15)
    assert scheduled_lr({**s, "lr_decay_style": "cosine"}, 4) == pytest.approx(5.5e-4, abs=1e-15)  # cos(pi/2)
    with pytest.raises(ValueError, match="'WSD'"):
        scheduled_lr({**s, "lr_decay_style": "WSD"}, 3)
    # Megatron's own scheduler (the one verl's engine steps once an update) on a torch optimizer gives the same
    for style in ("constant", "linear", "cosine"):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
        sched = OptimizerParamScheduler(opt, init_lr=0.0, max_lr=1e-3, min_lr=1e-4, lr_warmup_steps=2,
                                        lr_decay_steps=6, lr_decay_style=style, start_wd=0.1, end_wd=0.1,
                                        wd_incr_steps=6, wd_incr_style="constant")
        got = []
        for _ in range(8):
            got.append(opt.param_groups[0]["lr"])
            sched.step(1)
        assert got == pytest.approx([scheduled_lr({**s, "lr_decay_style": style}, k) for k in range(8)],
                                    rel=1e-12, abs=1e-18), style


def _touch(path: Path, when: float, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if text:
        path.write_text(text)
    else:
        path.mkdir(exist_ok=True)
    os.utime(path, (when, when))


def test_each_update_finds_its_runs_launch_across_a_kill(tmp_path):
    from mcore_dapo_checks.audit_reference import launch_overrides, update_number

    # a killed run (audit-killed: steps 1 and 2) and its resumed run (audit: loaded step 2, then steps 3 and 4),
    # each with Hydra's record of its command line, chained as mcore_dapo_checks/resume.chained_reference chains them
    t = 1_000_000.0
    _touch(tmp_path / "outputs/d/10-00-00/.hydra/overrides.yaml", t, "- a=1\n")
    for i in range(2):
        _touch(tmp_path / f"audit-killed/step-{i:04d}", t + 10 + i)
    _touch(tmp_path / "outputs/d/10-05-00/.hydra/overrides.yaml", t + 100, "- a=2\n")
    _touch(tmp_path / "audit/checkpoint-load-2", t + 110)
    for i in range(2):
        _touch(tmp_path / f"audit/step-{i:04d}", t + 120 + i)
    chain = tmp_path / "chained"
    chain.mkdir()
    for i, src in enumerate([*sorted((tmp_path / "audit-killed").glob("step-*")),
                             *sorted((tmp_path / "audit").glob("step-*"))]):
        (chain / f"step-{i:04d}").symlink_to(src, target_is_directory=True)
    steps = sorted(chain.glob("step-*"))
    assert [launch_overrides(s) for s in steps] == [["a=1"], ["a=1"], ["a=2"], ["a=2"]]
    assert [update_number(s) for s in steps] == [0, 1, 2, 3]
    assert [update_number(s) for s in sorted((tmp_path / "audit").glob("step-*"))] == [2, 3]
    # an audit made outside verl's trainer: no record, the engine's settings stand (optimizer_source "engine")
    alone = tmp_path / "elsewhere" / "audit" / "step-0000"
    alone.mkdir(parents=True)
    assert launch_overrides(alone) is None


@pytest.fixture(scope="module")
def updates(tmp_path_factory):
    """The tiny HF Qwen3-MoE and 4 real gradients of it (cross-entropy on random tokens), each of norm ~4."""
    from transformers import AutoModelForCausalLM

    from mcore_dapo_checks.tiny import make_tiny_model

    model = AutoModelForCausalLM.from_pretrained(
        str(make_tiny_model(tmp_path_factory.mktemp("tiny") / "m", seed=0)), dtype=torch.float32).train()
    gen = torch.Generator().manual_seed(0)
    grads = []
    for _ in range(4):
        model.zero_grad()
        ids = torch.randint(0, 256, (4, 12), generator=gen)
        model(input_ids=ids, labels=ids).loss.backward()
        grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})
    return model, grads


def _norm(g: dict) -> float:
    return float(torch.sqrt(sum((t.float() ** 2).sum() for t in g.values())))


def _chain(model, grads, settings, lrs) -> list[dict]:
    from mcore_dapo_checks.audit_reference import ReferenceAdam

    adam = ReferenceAdam(model, settings)
    out = []
    for g, lr in zip(grads, lrs):
        adam.step(g, lr)
        out.append({n: t.detach().clone() for n, t in adam.main.items()})
    return out


def _audit_bounds_reject(engine: list[dict], ref: list[dict], lrs) -> bool:
    """tests/test_verl_trainer.py's weight bounds over the chained updates: the engine's weights (bf16)
    against the reference's fp32 ones."""
    from mcore_dapo_checks.verl_dapo import beyond_one_step

    pytest.importorskip("transfer_queue")  # test_verl_trainer's own condition
    from test_verl_trainer import BEYOND_PER_UPDATE, HALF_SPACING

    lr_sum, n = 0.0, 0
    for e, r, lr in zip(engine, ref, lrs):
        lr_sum, n = lr_sum + lr, n + (lr > 0)
        beyond = sum(int(beyond_one_step(e[k].bfloat16(), r[k]).sum()) for k in r) / sum(t.numel() for t in r.values())
        worst = max(float((e[k].bfloat16().float() - r[k]).abs().max()) for k in r)
        if beyond > BEYOND_PER_UPDATE * n or worst >= 2.5 * lr_sum + HALF_SPACING:
            return True
    return False


def test_the_weights_alone_cannot_tell_weight_decay_or_clip_in_four_updates(updates):
    # why the settings are compared: the engine's weights under a weight decay of 0 or a clip of 10, against the
    # reference's under the launch's 0.1 and 1 (gradient norms ~4, over the clip), stay within the audit's weight
    # bounds over the trainer run's 4 updates; a learning rate off by 2 is rejected: the bounds see the lr, not
    # the weight decay or the clip
    model, grads = updates
    assert min(_norm(g) for g in grads) > 1.0
    launch = {k: ENGINE[k] for k in ("adam_beta1", "adam_beta2", "adam_eps", "weight_decay", "clip_grad")}
    ref = _chain(model, grads, launch, ENGINE_LRS)
    assert not _audit_bounds_reject(_chain(model, grads, launch, ENGINE_LRS), ref, ENGINE_LRS)
    assert not _audit_bounds_reject(_chain(model, grads, {**launch, "weight_decay": 0.0}, ENGINE_LRS), ref, ENGINE_LRS)
    assert not _audit_bounds_reject(_chain(model, grads, {**launch, "clip_grad": 10.0}, ENGINE_LRS), ref, ENGINE_LRS)
    assert _audit_bounds_reject(_chain(model, grads, launch, [2 * x for x in ENGINE_LRS]), ref, ENGINE_LRS)


def test_an_audited_update_is_planned_from_its_launch(tmp_path, launch):
    from omegaconf import OmegaConf

    from mcore_dapo_checks.audit_reference import planned_update

    # a run's working folder as verl's trainer leaves it: Hydra's record, then the audit's update 2 (step-0001
    # after the checkpoint of step 1 was loaded) with the engine's record of it
    t = 1_000_000.0
    record = tmp_path / "outputs/d/10-00-00/.hydra/overrides.yaml"
    record.parent.mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(launch), record)
    os.utime(record, (t, t))
    _touch(tmp_path / "audit/checkpoint-load-1", t + 5)
    step = tmp_path / "audit/step-0001"
    _touch(step, t + 10)
    p = planned_update(step, {"optimizer": ENGINE, "lr": 1e-3})
    assert (p["optimizer_source"], p["update_number"], p["lr_expected"], p["optimizer_failures"]) == (
        "launch", 2, 1e-3, [])
    assert p["settings"]["weight_decay"] == 0.1 and p["settings"]["clip_grad"] == 1.0
    # the engine's record mutated: each difference named, and the reference's settings stay the launch's
    p = planned_update(step, {"optimizer": {**ENGINE, "clip_grad": 10.0}, "lr": 5e-4})
    assert [f.split(":")[0] for f in p["optimizer_failures"]] == ["clip_grad", "lr"]
    assert p["settings"]["clip_grad"] == 1.0 and p["lr_expected"] == 1e-3
    # no launch recorded: the engine's settings, nothing compared
    alone = tmp_path / "elsewhere/audit/step-0000"
    alone.mkdir(parents=True)
    p = planned_update(alone, {"optimizer": ENGINE, "lr": 1e-3})
    assert (p["optimizer_source"], p["settings"], p["optimizer_failures"]) == ("engine", ENGINE, [])


def test_groups_drawn_counts_trained_and_evicted_groups():
    from mcore_dapo_checks.resume import groups_drawn

    # 4 steps of 4 groups, dynamic sampling evicting 1, none, 2 and none: 16 + 3 prompts taken from the loader
    metrics = [{"training/filter_groups/evicted_samples": 1.0}, {}, {"training/filter_groups/evicted_samples": 2.0},
               {"critic/score/mean": 0.0}]
    assert groups_drawn(metrics, 4) == 19
    assert groups_drawn(metrics[:2], 4) == 9
