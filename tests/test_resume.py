"""Resume: a killed run continues where it stopped, exactly, also on another layout.

* Through verl's trainer with the launch scripts' settings (:mod:`mcore_dapo_checks.resume`, the session
  fixture ``dapo_trainer_run``): a run gets SIGKILL on every process once step 3's update has begun, and the
  same command again resumes with ``resume_mode=auto``. Its steps 3 and 4 are held against the uninterrupted
  computation through the audit (weights, learning rate, loss, grad norm, the optimizer step chained across the
  kill), and what its engine held after loading against what the killed run's held when it saved. The two runs'
  4 steps are also the run ``tests/test_verl_trainer.py`` checks.
* At engine level (:mod:`mcore_dapo_checks.reshard_resume`, verl's worker calls under torchrun): a checkpoint
  saved under EP2 resumes under EP2 (the periodic save's format) and, saved as a run's last step, under TP2·EP2
  (ETP1) and PP2·EP2, optimizer state included; each launch ends with a save of the next step killed at one
  point (in the background once the save returned; synchronously after the optimizer's files; in the background
  once the checkpoint is in place but before the tracker names it), and what ``resume_mode=auto`` then takes is
  checked.
* Bad input: another model, a layout the optimizer state cannot take, a truncated file, a damaged tracker:
  one line each, naming what differs and the previous complete checkpoint.
"""

import json
import shutil
from pathlib import Path

import pytest

# torchrun ranks of real Megatron on one host, gloo. The first trainer test's fixture runs two trainer runs (the
# killed and the resumed one) and the chained reference; the engine-level launches took 4.2 min of 13.7 for the
# whole file when it had a third trainer run, measured on the 2-core host under other work
pytestmark = [pytest.mark.cpu_only, pytest.mark.timeout(2400)]

pytest.importorskip("verl")


# ---------------------------------------------------------------------------------------------------------------
# the trainer, killed during step 3 and resumed


@pytest.fixture(scope="module")
def resumed(dapo_trainer_run):
    # tests/conftest.py's run: with this file selected, the killed and the resumed run (mcore_dapo_checks/resume.four_steps),
    # whose 4 steps tests/test_verl_trainer.py checks as the trainer's run
    pytest.importorskip("transfer_queue")
    r = dapo_trainer_run
    assert r["pair"] is not None, "tests/conftest.py's dapo_trainer_run ran without the kill"
    assert r["returncode"] == 0, r["error"] or r["log_tail"]
    return r["pair"]


def test_the_killed_run_stopped_after_step_3_began_with_checkpoint_2_complete(resumed):
    killed = resumed["killed"]
    assert killed["returncode"] == -9  # SIGKILL to every process of the trainer's session
    # steps 1 and 2 finished; the kill comes once step 3's update has begun and checkpoint 2, saved in the background,
    # is complete. The save may complete after step 3 has ended (a loaded machine, once): then step 3 is logged and
    # the kill lands in step 4; either way nothing after step 2 was checkpointed and the resumed run trains 3 and 4
    assert killed["steps_logged"] in (2, 3)
    assert killed["tracker"] == "2" and killed["step_folders"] == ["global_step_2"]


def test_the_resumed_run_starts_at_step_3(resumed):
    from mcore_dapo_checks.tiny_dapo import read_metrics

    steps = [r["data"]["training/global_step"] for r in read_metrics(Path(resumed["resumed"]["metrics_log"]))]
    assert steps == [3, 4]
    assert resumed["compare"]["resumed_updates"] == 2


def test_tiny_dapo_reports_the_resumed_run_by_its_global_steps(resumed):
    """``mcore-dapo tiny-dapo --steps 4`` over a workdir with checkpoint 2 trains steps 3 and 4: reported as those
    steps, and a success (its last step reaches --steps), not as steps 1 and 2 short of 4. The reference is verl's
    own ``training/global_step`` of each logged line."""
    from mcore_dapo_checks.cli.tiny_dapo import report
    from mcore_dapo_checks.tiny_dapo import read_metrics

    logged = [r["data"]["training/global_step"] for r in read_metrics(Path(resumed["resumed"]["metrics_log"]))]
    out, ok = report(resumed["resumed"], 4, start=int(resumed["killed"]["tracker"]))
    assert [s["step"] for s in out["steps"]] == logged == [3, 4]
    assert ok and out["resumed_from"] == 2
    assert not report(resumed["resumed"], 5, start=2)[1]  # a run short of --steps is not a success


# Which groups a step trains on is not deterministic between two runs of the same command: verl's dynamic sampling
# keeps the groups that complete first, and the order in which concurrent requests complete on the two rollout
# replicas varies (two fresh runs of this command kept different groups at step 1, measured). The training given a
# batch is deterministic. So the resumed steps are held bit for bit where the kill could change something (the
# weights and optimizer state they start from, the learning rate, the dataloader's position), and their updates
# against the uninterrupted computation: each of the killed run's steps 1 and 2 and the resumed run's steps 3 and 4
# recomputed on the HF model in fp32, with Megatron's optimizer step chained across the kill
# (mcore_dapo_checks/resume.chained_reference), under tests/test_verl_trainer.py's tolerances (argued there)


def test_the_resumed_steps_continue_the_uninterrupted_computation(resumed, dapo_trainer_run):
    from test_verl_trainer import BEYOND_PER_UPDATE, HALF_SPACING, LOSS_ABS, LOSS_AGGREGATION_ABS, check_parts

    from mcore_dapo_checks.resume import KILL_STEP

    c = resumed["compare"]
    # the first resumed update starts from the weights the killed run checkpointed, bit for bit
    assert c["first_weights_vs_checkpointed"] == []
    # the learning rate each update applied: the scripts' schedule, warm-up then 1e-3, as an uninterrupted run's
    # (tests/test_verl_trainer.py's on the Ascend line); the scheduler restored: a restarted warm-up would apply 0
    # at step 3
    lrs = [r["lr"] for r in c["killed"]] + [r["lr"] for r in c["resumed"]]
    assert lrs == [0.0] + [pytest.approx(1e-3)] * 3
    chained = c["chained_reference"]
    assert len(chained) == 4
    lr_sum, updates = 0.0, 0
    for step, a in enumerate(chained, start=1):
        lr_sum += a["lr"]
        updates += a["lr"] > 0
        assert abs(a["engine_loss"] - a["loss_at_engine_log_probs"]) < LOSS_AGGREGATION_ABS, (step, a)
        assert a["engine_loss"] == pytest.approx(a["reference_loss"], abs=LOSS_ABS), (step, a)
        assert a["weights_beyond_one_step"] <= BEYOND_PER_UPDATE * updates, (step, a)
        assert a["weights_max_abs_diff"] < 2.5 * lr_sum + HALF_SPACING, (step, a)
    check_parts(chained)  # each part's gradient against the chained reference's
    # the control: the resumed run's first update against a reference whose Adam starts there (fresh moments and
    # step, as a resume without the optimizer state would run) is far further off than against the chained one
    own = resumed["resumed"]["audit"][0]
    assert own["weights_beyond_one_step"] > 3 * chained[KILL_STEP - 1]["weights_beyond_one_step"], (own, chained)
    # the dataloader went on from the checkpoint's position: it had yielded the killed run's prompts (steps 1 and 2,
    # dynamic sampling's refills included) and then at least a batch per resumed step (a loader restarted from the
    # beginning would count the resumed run's own prompts only)
    y = c["dataloader_yielded"]
    assert y["killed_step2"] >= 2 * 4 and y["resumed_step4"] >= y["killed_step2"] + 2 * 4, y
    # ... and its count covers every group drawn over the four steps, trained or evicted by dynamic sampling (a
    # loader restarted at the resume counts only the resumed run's share and the prompts fetched ahead, short of
    # the killed run's 8 trained groups at least)
    from mcore_dapo_checks.resume import groups_drawn

    assert y["resumed_step4"] >= groups_drawn(dapo_trainer_run["metrics"], 4), y


def test_samples_in_flight_at_the_kill_are_dropped_not_trained_twice(resumed):
    # the asynchronous trainer generates ahead: at the kill, groups for step 3 and later were in flight or waiting in
    # verl's replay buffer. They die with the killed run; the resumed run's loader starts after every prompt the
    # killed run had drawn by its checkpoint (data.pt), so those prompts are skipped, and no prompt the killed run
    # trained is trained again (the task's 48 prompts are distinct)
    p = resumed["compare"]["prompts"]
    assert p["killed"] >= 2 * 4 and p["resumed"] >= 2 * 4, p
    assert p["trained_twice"] == 0, p


def test_what_the_checkpoint_held_is_what_the_resumed_run_loaded(resumed):
    # model, each optimizer parameter (the distributed optimizer's fp32 main shards) with Adam's moments and step,
    # the LR scheduler, the RNG states (one per rank: under EP each rank's expert-parallel tracker state is its
    # own): per rank, the resumed engine after its load against the killed engine right after its save of step 2
    r = resumed["compare"]["restored"]
    assert r["ranks"][0] == r["ranks"][1] > 0
    assert r["differ"] == {"model": [], "optimizer": [], "lr_scheduler": [], "rng": [], "lr": []}, r
    assert {"exp_avg", "exp_avg_sq", "step", "param"} <= set(r["optimizer_state_keys"]), r
    assert r["main_param_dtypes"] == ["torch.float32"] and r["moments_nonzero"], r
    assert r["lr_scheduler"]["num_steps"] == 2, r  # two updates scheduled: warm-up over


def test_the_final_checkpoint_holds_the_last_updates_weights(resumed):
    from transformers import AutoModelForCausalLM

    from mcore_dapo_checks.resume import weights_differ

    final = Path(resumed["checkpoints"]) / "global_step_4" / "actor" / "model" / "huggingface"
    last = Path(resumed["resumed_audit"]) / "step-0001" / "hf-after"
    assert weights_differ(final, last) == []
    AutoModelForCausalLM.from_pretrained(final)  # config.json and the tokenizer beside the weights


# ---------------------------------------------------------------------------------------------------------------
# engine level: another layout, and kills during a save

# what the next update may differ by under another layout: the weights after it, share of elements more than one
# bf16 step from the uninterrupted run's. TP2 splits the attention and dense matmuls and reduces bf16 partial
# results in another order, so gradients differ by bf16 rounding, and Adam's first steps move an element by ~lr
# whatever its gradient's size (a sign flip near zero lands 2 lr away): test_verl_engine.py's bf16 bound, 0.05;
# measured 0.9 % (TP2), 0 (PP2: each stage computes what the EP2 rank computed). Without the optimizer state
# (fresh Adam) 91 % of the elements land more than a step away: the bound tells a restored state from a lost one.
BEYOND_ONE_STEP = 0.05
# grad norm: the same bf16 rounding of the gradients, 1e-2 relative as test_verl_trainer.py's (measured 3e-4)
LAYOUT_REL = 1e-2


@pytest.fixture(scope="module")
def reshard(tiny_moe, tmp_path_factory):
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    from mcore_dapo.bridge.layout import Layout
    from mcore_dapo.convert.api import hf2mcore
    from mcore_dapo_checks.reshard_resume import ASYNC, LAST_STEP, checksums_differ, launch
    from mcore_dapo.verl_plugin import checkpoint

    work = tmp_path_factory.mktemp("reshard")
    after = {}

    def state(point):
        step2 = work / "global_step_2" / "actor"
        latest = find_latest_ckpt_path(str(work))
        # content: step 1 (what resume_mode=auto takes) against what the save launch's ranks held at its save;
        # the completed step 2 against what the killed launch's ranks held at its save
        after[point] = {"step1_content": checksums_differ(work / "held" / "step-1", work / "global_step_1" / "actor"),
                        "step2_content": checksums_differ(work / "held" / "step-2", step2)
                        if point == "tracker" else None}
        try:
            checkpoint.check(step2, here_record(work))
            refused = None
        except Exception as e:  # noqa: BLE001 - the refusal's type is asserted by the test
            refused = e
        after[point] |= {"latest": latest, "step2_problem": checkpoint.problem(step2), "step2_refused": refused,
                         "step2_files": sorted(str(p.relative_to(step2)) for p in step2.rglob("*") if p.is_file())
                         if step2.is_dir() else None,
                         "partial": checkpoint.partial_path(step2).is_dir()}

    # hf2mcore's torch_dist checkpoint: the start of the save launch's engine with use_dist_checkpointing=True
    hf2mcore(tiny_moe, work / "dist-start", Layout(ep=2), progress=False)
    # saved in the background as the launch scripts save (checkpoint.async_save=True), but in the TP2 launch
    last = ("--checkpoint", str(work / "last" / f"global_step_{LAST_STEP}" / "actor"))
    out = {"save": launch("save", tiny_moe, work, ep=2, kill_in_save="background", timeout=900,
                          extra=("--dist-start", str(work / "dist-start"), "--set", ASYNC))}
    state("background")
    out["tp2"] = launch("resume", tiny_moe, work, tp=2, ep=2, kill_in_save="optimizer", timeout=900, extra=last)
    state("optimizer")
    out["pp2"] = launch("resume", tiny_moe, work, pp=2, ep=2, nproc=4, kill_in_save="tracker", timeout=900,
                        extra=(*last, "--set", ASYNC))
    state("tracker")
    return out, after, work


def here_record(work: Path) -> dict:
    """The engine record of the checkpoint's own writer (global_step_1): a check that passes unless the folder
    itself is incomplete or damaged."""
    return {k: v for k, v in json.loads((work / "global_step_1" / "actor" / "mcore_dapo_resume.json").read_text())
            .items() if k in ("model", "layout", "optimizer")}


def test_resume_under_the_same_layout_is_exact(reshard):
    save = reshard[0]["save"]
    assert save["layout"] == "TP1 PP1 EP2 ETP1"
    same = save["same_layout"]
    assert same["loaded_vs_saved"]["differ"] == 0
    # every piece restored, per rank: weights, fp32 main params, Adam moments and step, LR scheduler, RNG states
    assert same["restored_differ"] == []
    assert same["update"]["loss"] == save["uninterrupted"]["loss"]
    assert same["update"]["grad_norm"] == save["uninterrupted"]["grad_norm"]
    assert same["update"]["scheduler_steps"] == save["uninterrupted"]["scheduler_steps"] == 2
    assert same["weights"]["differ"] == 0 and same["weights"]["moved_by_update"] > 0.5
    # the control: the same weights with a fresh optimizer land elsewhere
    assert save["without_optimizer"]["weights"]["beyond_one_bf16_step"] > 0.5


@pytest.mark.parametrize("layout", ["tp2", "pp2"])
def test_an_ep2_checkpoint_resumes_under_another_layout(reshard, layout):
    out = reshard[0][layout]
    assert out["layout"] == {"tp2": "TP2 PP1 EP2 ETP1", "pp2": "TP1 PP2 EP2 ETP1"}[layout]
    assert out["loaded_vs_saved"]["differ"] == 0  # the weights the checkpoint holds, bit for bit
    want = out["uninterrupted"]
    assert out["update"]["lr"] == want["lr"] and out["update"]["scheduler_steps"] == want["scheduler_steps"] == 2
    assert out["update"]["loss"] == pytest.approx(want["loss"], rel=LAYOUT_REL)
    assert out["update"]["grad_norm"] == pytest.approx(want["grad_norm"], rel=LAYOUT_REL)
    assert out["weights"]["beyond_one_bf16_step"] < BEYOND_ONE_STEP, out["weights"]
    assert out["weights"]["moved_by_update"] > 0.5


@pytest.mark.parametrize("point", ["background", "optimizer"])
def test_a_save_killed_half_way_is_not_taken(reshard, point):
    from mcore_dapo.errors import UserError

    after, work = reshard[1][point], reshard[2]
    # verl's resume_mode=auto follows the tracker, which still names step 1, and step 1 is complete
    assert after["latest"] == str(work / "global_step_1")
    assert after["partial"] and after["step2_files"] is None  # what the killed save wrote stays in .actor.partial
    # a resume from global_step_2 itself (resume_mode=resume_path) is refused in one line offering step 1
    e = after["step2_refused"]
    assert isinstance(e, UserError) and "\n" not in str(e)
    assert "incomplete" in str(e) and f"previous complete checkpoint is {work / 'global_step_1'}" in str(e)
    # and step 1 holds, tensor for tensor, what the save launch's ranks held when they saved it
    content_is_held(after["step1_content"], ranks=2)


def content_is_held(c: dict, ranks: int) -> None:
    """A checkpoint's files against the crc32s its ranks computed from what they held at its save
    (mcore_dapo_checks/reshard_resume.checksums_differ): every HF tensor, every optimizer shard and moment."""
    assert c["differ"] == [], c["differ"][:10]
    assert c["ranks"] == ranks and c["hf_tensors"] > 100, c  # the tiny MoE's HF tensors: 135
    assert min(c["optimizer_shards"].values()) > 0 and len(set(c["optimizer_shards"].values())) == 1, c
    # chunks on disk no rank held: the buckets' padding, the same in each state and a sliver of it
    assert len(set(c["unheld_chunks"].values())) == 1, c
    assert all(c["unheld_elements"][s] < 0.01 * c["optimizer_elements"][s] for s in c["unheld_elements"]), c


def test_a_save_killed_before_the_tracker_leaves_both_checkpoints_whole(reshard):
    from mcore_dapo.verl_plugin.checkpoint import RESUME_FILE

    after, work = reshard[1]["tracker"], reshard[2]
    assert after["latest"] == str(work / "global_step_1")  # the tracker was not written
    assert after["step2_problem"] is None and not after["partial"]
    # written again over the two killed saves' leftovers: exactly the files its record lists
    record = json.loads((work / "global_step_2" / "actor" / RESUME_FILE).read_text())
    assert sorted([*record["files"], RESUME_FILE]) == after["step2_files"]
    # and their content: step 2 what the killed launch's 4 ranks held at its save, step 1 the save launch's
    content_is_held(after["step2_content"], ranks=4)
    content_is_held(after["step1_content"], ranks=2)


def flip_byte(path: Path, data: bytes) -> None:
    """One bit of ``data`` flipped where the file holds it (once: the bytes are found exactly once)."""
    blob = bytearray(path.read_bytes())
    at = blob.find(data)
    assert at >= 0 and blob.find(data, at + 1) < 0, path
    blob[at + len(data) // 2] ^= 0x01
    path.write_bytes(bytes(blob))


def test_a_flipped_bit_in_a_complete_checkpoint_is_found(reshard, tmp_path):
    """The content check's control: a copy of the complete step 2 with one bit flipped in an HF tensor and in an
    optimizer shard (sizes unchanged: the record's check passes it) is named, those two tensors and nothing else."""
    import torch
    from safetensors import safe_open

    from mcore_dapo.verl_plugin import checkpoint
    from mcore_dapo_checks.reshard_resume import checksums_differ, crc32, optimizer_chunks

    work = reshard[2]
    copy = tmp_path / "global_step_2" / "actor"
    shutil.copytree(work / "global_step_2" / "actor", copy)
    shard = sorted((copy / "model" / "huggingface").glob("*.safetensors"))[0]
    with safe_open(str(shard), "pt") as f:
        name = sorted(f.keys())[0]
        t = f.get_tensor(name)
    flip_byte(shard, t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    key, offsets, piece = next(c for c in optimizer_chunks(copy) if c[0].endswith(".param") and c[2].numel() >= 64)
    data = piece.contiguous().numpy().tobytes()
    victim = next(p for p in (copy / "optimizer" / "dist_ckpt").glob("*.distcp") if data in p.read_bytes())
    flip_byte(victim, data)
    assert checkpoint.problem(copy) is None  # complete by its record's file sizes
    c, whole = checksums_differ(work / "held" / "step-2", copy), checksums_differ(work / "held" / "step-2",
                                                                                  work / "global_step_2" / "actor")
    assert c["differ"] == [f"hf {name}", f"held param shard of {piece.numel()} elements (crc32 {crc32(piece)}) "
                           "not on disk"], c["differ"]
    assert c["unheld_chunks"]["param"] == whole["unheld_chunks"]["param"] + 1  # the flipped chunk


def test_the_remote_copy_is_the_complete_checkpoint_with_its_record(reshard):
    """``trainer.default_hdfs_dir``: verl uploads as its save ends, before the engine's record is written; the
    copy is made of the checkpoint once complete, every file the same, its record included."""
    from mcore_dapo.verl_plugin.checkpoint import RESUME_FILE

    work = reshard[2]
    local, remote = work / "global_step_1" / "actor", work / "remote" / "global_step_1" / "actor"
    files = sorted(str(p.relative_to(local)) for p in local.rglob("*") if p.is_file())
    assert RESUME_FILE in files and any(f.startswith("optimizer/") for f in files)
    assert sorted(str(p.relative_to(remote)) for p in remote.rglob("*") if p.is_file()) == files
    assert all((remote / f).read_bytes() == (local / f).read_bytes() for f in files)


def test_the_checkpoints_hf_weights_load_in_transformers_and_are_the_engines(reshard):
    import torch
    from transformers import AutoModelForCausalLM

    from mcore_dapo.io.hf_reader import HFReader

    work = reshard[2]
    hf = work / "global_step_1" / "actor" / "model" / "huggingface"
    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.bfloat16)  # config.json beside the weights
    at_save = torch.load(work / "uninterrupted.pt", weights_only=False)["at_save"]  # the engine's export
    with HFReader(hf) as r:
        assert sorted(r.keys()) == sorted(at_save)
        assert all(torch.equal(r.get(n), t) for n, t in at_save.items())
    assert model.config.num_hidden_layers == 4
    # written by both EP ranks (each its experts, the dense tensors in turns), not gathered to one
    assert reshard[0]["save"]["hf_save"]["writer_ranks"] == 2


# the engine's log-probs (bf16 model, fp32 logits: Float16Module) against transformers' fp32 forward of the same
# bf16 weights: bf16 rounds each layer's activations to 2^-8 relative, which through 4 layers and the final norm
# moves a logit of size ~1 to ~5 by a few 1e-2 at most (measured 6.1e-3); LOGP_TOL = 0.1. Wrong weights (another
# tensor's, a transposed or unfused expert) move the log-probs of this random model (up to 6.7 nats) by whole units.
LOGP_TOL = 0.1


def test_the_checkpoints_hf_weights_give_the_engines_log_probs(reshard):
    import torch
    from transformers import AutoModelForCausalLM

    from mcore_dapo_checks.verl_dapo import PROMPT

    work = reshard[2]
    saved = torch.load(work / "uninterrupted.pt", weights_only=False)
    tokens, mask = saved["batch"]["tokens"], saved["batch"]["response_mask"].float()
    model = AutoModelForCausalLM.from_pretrained(work / "global_step_1" / "actor" / "model" / "huggingface",
                                                 dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(tokens).logits.float()
    logp = torch.log_softmax(logits[:, PROMPT - 1:-1], -1).gather(-1, tokens[:, PROMPT:, None]).squeeze(-1) * mask
    diff = float((logp - saved["engine_logp"]).abs().max())
    assert diff < LOGP_TOL, diff
    assert float(logp.abs().max()) > 10 * LOGP_TOL  # log-probs of whole units: the bound is not vacuous


@pytest.fixture(scope="module")
def dist_model(reshard, tiny_moe):
    """The save launch's engine with ``megatron.use_dist_checkpointing=True``: its weights from ``hf2mcore``'s
    torch_dist checkpoint, one update, a save that writes the Megatron model beside the HF weights (the launch
    scripts keep verl's default, False: their checkpoints hold the HF weights alone, tested above); then
    ``mcore2hf`` of that Megatron model."""
    from mcore_dapo.convert.api import mcore2hf

    out, work = reshard[0]["save"]["dist_model"], reshard[2] / "dist-model"
    model = work / "global_step_1" / "actor" / "model"
    mcore2hf(model / "dist_ckpt", work / "converted", hf_config=tiny_moe, nproc=2, progress=False)
    return out, work, model


def test_mcore2hf_of_the_checkpoints_megatron_model_is_its_hf_weights_bit_for_bit(dist_model, tiny_moe):
    import torch

    from mcore_dapo.io.hf_reader import HFReader

    out, work, model = dist_model
    assert any(f.startswith("model/dist_ckpt/") for f in out["files"])
    saved = torch.load(work / "weights.pt", weights_only=False)
    with HFReader(work / "converted") as conv, HFReader(model / "huggingface") as hf, HFReader(tiny_moe) as start:
        assert sorted(conv.keys()) == sorted(hf.keys()) == sorted(saved["at_save"])
        differ = [n for n in hf.keys() if not torch.equal(conv.get(n), hf.get(n))]
        assert not differ, differ[:5]
        assert all(torch.equal(hf.get(n), t) for n, t in saved["at_save"].items())  # the engine's, at the save
        # the engine started from hf2mcore's checkpoint: the HF weights (bf16), and the update moved them
        assert all(torch.equal(t, start.get(n).to(t.dtype)) for n, t in saved["loaded"].items())
        assert sum(not torch.equal(hf.get(n), start.get(n).to(hf.get(n).dtype)) for n in hf.keys()) > len(hf.keys()) // 2


# ---------------------------------------------------------------------------------------------------------------
# bad input: one line, before anything is loaded


def test_a_checkpoint_of_another_model_is_one_line(reshard):
    from mcore_dapo.errors import UserError
    from mcore_dapo.verl_plugin.checkpoint import check

    work = reshard[2]
    here = here_record(work)
    here["model"] = {**here["model"], "hidden_size": 96, "num_experts": 16}
    with pytest.raises(UserError) as e:
        check(work / "global_step_1" / "actor", here)
    msg = str(e.value)
    assert "\n" not in msg and "another model" in msg
    assert "hidden_size 64 there, 96 here" in msg and "num_experts 8 there, 16 here" in msg


def test_resuming_another_model_is_refused_before_ray(reshard, tmp_path):
    from mcore_dapo.errors import UserError
    from mcore_dapo_checks.tiny import make_tiny_model
    from mcore_dapo_checks.verl_engine import overrides
    from mcore_dapo.verl_plugin.checkpoint import check_resume
    from mcore_dapo.verl_plugin.main_dapo import compose
    from mcore_dapo.verl_plugin.overrides import rewrite

    other = make_tiny_model(tmp_path / "other", hidden_size=96)
    step1 = reshard[2] / "global_step_1"
    c = compose(rewrite(overrides(str(other), 2) + ["trainer.resume_mode=resume_path",
                                                      f"trainer.resume_from_path={step1}"]))
    with pytest.raises(UserError) as e:
        check_resume(c)  # what main_dapo runs before Ray starts
    assert "\n" not in str(e.value) and "another model: hidden_size 64 there, 96 here" in str(e.value)


def test_a_layout_the_optimizer_state_cannot_take_is_one_line(reshard, tmp_path):
    from mcore_dapo.errors import UserError
    from mcore_dapo.verl_plugin.checkpoint import RESHARDABLE_KEY, check, optimizer_format

    work = reshard[2]
    here = here_record(work)
    here["layout"] = {**here["layout"], "ep": 1, "pp": 2}
    with pytest.raises(UserError) as e:
        check(work / "global_step_1" / "actor", here)
    assert "\n" not in str(e.value) and "EP = 1" in str(e.value) and "TP1 PP1 EP2 ETP1" in str(e.value)
    check(work / "global_step_1" / "actor", here, load_optimizer=False)  # the weights alone load anywhere
    # the periodic save's format (dp_reshardable, megatron-core >= 0.14) under another model-parallel layout
    fmt = json.loads((work / "global_step_1" / "actor" / "mcore_dapo_resume.json").read_text())["optimizer"]
    if fmt["sharding_type"] == optimizer_format(True, reshardable=True):
        return  # megatron-core 0.12.1: its format with no gather loads under another layout (the resumes above)
    here = {**here_record(work), "layout": {**here_record(work)["layout"], "tp": 2}}
    with pytest.raises(UserError) as e:
        check(work / "global_step_1" / "actor", here)
    msg = str(e.value)
    assert "\n" not in msg and "Megatron's dp_reshardable format" in msg and "TP1 PP1 EP2 ETP1 on 2 ranks" in msg
    assert "this run is TP2 PP1 EP2 ETP1" in msg and RESHARDABLE_KEY in msg
    assert "no checkpoint beside it is in a format another layout loads" in msg
    # beside a reshardable checkpoint (the run's last save, in place of a later periodic one), that one is offered
    for step, src in ((6, work / "global_step_1"), (4, work / "last" / "global_step_4")):
        shutil.copytree(src, tmp_path / f"global_step_{step}")
    with pytest.raises(UserError) as e:
        check(tmp_path / "global_step_6" / "actor", here)
    assert f"resume from {tmp_path / 'global_step_4'}, whose optimizer state" in str(e.value)
    check(tmp_path / "global_step_4" / "actor", here)  # which loads under TP2 (as test_an_ep2_checkpoint_... did)
    check(work / "global_step_1" / "actor", {**here, "layout": {**here["layout"], "tp": 1, "world_size": 4}})
    # (another data-parallel size: the same model-parallel layout takes it)


def test_a_truncated_checkpoint_file_is_one_line_naming_it_and_the_previous_checkpoint(reshard, tmp_path):
    from mcore_dapo.errors import UserError
    from mcore_dapo.verl_plugin.checkpoint import check

    work = reshard[2]
    for step in (1, 3):
        shutil.copytree(work / "global_step_1" / "actor", tmp_path / f"global_step_{step}" / "actor")
    victim = sorted((tmp_path / "global_step_3" / "actor" / "optimizer" / "dist_ckpt").glob("*.distcp"))[0]
    size = victim.stat().st_size
    with open(victim, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(UserError) as e:
        check(tmp_path / "global_step_3" / "actor", here_record(work))
    msg = str(e.value)
    assert "\n" not in msg and str(victim) in msg and f"{size // 2} bytes, {size} were written" in msg
    assert f"previous complete checkpoint is {tmp_path / 'global_step_1'}" in msg


@pytest.mark.parametrize("damage", ["record", "index"])
def test_a_missing_shard_is_one_line_naming_it_and_the_previous_checkpoint(reshard, tmp_path, damage):
    """A record that names a file not there; an HF index that names a shard not there (and the record does not)."""
    from mcore_dapo.errors import UserError
    from mcore_dapo.verl_plugin.checkpoint import RESUME_FILE, check

    work = reshard[2]
    for step in (1, 3):
        shutil.copytree(work / "global_step_1" / "actor", tmp_path / f"global_step_{step}" / "actor")
    folder = tmp_path / "global_step_3" / "actor"
    hf = folder / "model" / "huggingface"
    victim = sorted(hf.glob("*.safetensors"))[-1]
    victim.unlink()
    if damage == "index":
        record = json.loads((folder / RESUME_FILE).read_text())
        del record["files"][str(victim.relative_to(folder))]
        (folder / RESUME_FILE).write_text(json.dumps(record))
    with pytest.raises(UserError) as e:
        check(folder, here_record(work))
    msg = str(e.value)
    want = f"checkpoint file {victim} is missing" if damage == "record" else (
        f"{hf / 'model.safetensors.index.json'} names {victim.name}, which is missing")
    assert "\n" not in msg and want in msg and f"previous complete checkpoint is {tmp_path / 'global_step_1'}" in msg


def test_a_damaged_tracker_is_one_line_before_ray(reshard, tmp_path):
    from mcore_dapo.errors import UserError
    from mcore_dapo_checks.verl_engine import overrides
    from mcore_dapo.verl_plugin.checkpoint import check_resume
    from mcore_dapo.verl_plugin.main_dapo import compose
    from mcore_dapo.verl_plugin.overrides import rewrite

    work = reshard[2]
    shutil.copytree(work / "global_step_1", tmp_path / "global_step_1")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("")  # killed between open and write
    hf = work / "global_step_1" / "actor" / "model" / "huggingface"
    c = compose(rewrite(overrides(str(hf), 2) + [f"trainer.default_local_dir={tmp_path}", "trainer.resume_mode=auto"]))
    with pytest.raises(UserError) as e:
        check_resume(c)  # what main_dapo runs before Ray starts
    assert "\n" not in str(e.value) and "latest_checkpointed_iteration.txt" in str(e.value)
    assert f"previous complete checkpoint is {tmp_path / 'global_step_1'}" in str(e.value)
