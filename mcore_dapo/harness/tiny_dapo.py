"""verl's DAPO trainer end to end on the CPU: the tiny Qwen3-MoE, the plugin's Megatron engine (EP2),
the ``hf_cpu`` rollout, the ``dapo`` reward manager with the overlong penalty, dynamic sampling
(``algorithm.filter_groups``), a few steps, verl's metrics log.

``python -m mcore_dapo.harness.tiny_dapo --workdir W --steps 3``

prepares ``W`` (model + word-level tokenizer with a chat template, train/val parquet files, the
reward function) and runs ``python -m mcore_dapo.verl_plugin.main_dapo <overrides>``: the same
entry point and the same DAPO overrides as ``configs/dapo_qwen3_30b_*.sh``, with tiny sizes,
``trainer.device=cpu`` and the rollout on the CPU. verl writes its metrics, one JSON line per
step, to ``W/metrics.jsonl`` and its console log to ``W/train.log``; ``W/tiny_dapo.png`` plots
reward, response length, throughput and the timing breakdown per step (``mcore-dapo metrics``
reads the same log); the last line printed is a JSON summary.

The task: a prompt of 8 tokens and a target parity; a response is correct when its first token
has that parity (about half of a random policy's answers). Every fourth prompt accepts any
answer: its groups are all correct, carry no signal, and dynamic sampling must drop them (as
it drops the all-right / all-wrong groups that chance produces). Score +1 / -1, plus the dapo
manager's overlong penalty.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

PROMPT_TOKENS, PROMPTS = 8, 64
MAX_PROMPT, MAX_RESPONSE, OVERLONG = 16, 12, 6
TRAIN_BSZ, N = 4, 4
WORDS, NEWLINE, IM_END, PAD = 253, 253, 254, 255


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """+1 when the first response token has the target parity, else -1; ``acc`` for filter_groups."""
    words = solution_str.split()
    ok = ground_truth == "any" or (bool(words) and words[0].startswith("t") and words[0][1:].isdigit()
                                   and int(words[0][1:]) % 2 == int(ground_truth))
    return {"score": 1.0 if ok else -1.0, "acc": float(ok)}


def chatml_tokenizer(words=None):
    """A word-level tokenizer over the tiny vocabulary, ``t0`` .. ``t252`` plus the ChatML pieces verl's
    Qwen handling relies on (``\\n`` as one token, ``<|im_end|>`` as end of turn). ``words``: another
    253 words for ids 0 .. 252 (the ChatML ids stay); then words split at whitespace only, so that a
    word may hold punctuation (``Answer:``), and an unknown word reads as the first one."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if words is not None and len(set(words)) != WORDS:
        raise ValueError(f"chatml_tokenizer needs {WORDS} distinct words, got {len(set(words))}")
    vocab = {w: i for i, w in enumerate(words)} if words is not None else {f"t{i}": i for i in range(WORDS)}
    vocab.update({"\n": NEWLINE, "<|im_end|>": IM_END, "<|endoftext|>": PAD})
    tok = Tokenizer(models.WordLevel(vocab, unk_token=words[0] if words is not None else "t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace() if words is None else pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken("<|im_end|>", special=True), AddedToken("<|endoftext|>", special=True),
                            AddedToken("\n", special=False, normalized=False)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = ("{% for m in messages %}{{ m['content'] }}<|im_end|>\n{% endfor %}")
    return fast


ROLLOUTS = ("hf_cpu", "vllm")
VLLM_HEAD_DIM = 32  # vLLM's CPU attention refuses the tiny default of 16


def prepare(workdir: Path, rollout: str = "hf_cpu") -> dict:
    import pandas as pd
    import torch

    from mcore_dapo.harness.tiny import make_tiny_model

    import shutil

    model = workdir / "tiny-qwen3-moe"
    shutil.rmtree(model, ignore_errors=True)  # generated anew (seeded, under a second), never a stale copy
    # no pad_token_id in the model's config: transformers would zero that embedding row and freeze it
    # (padding_idx), Megatron trains every row; the policy samples <|endoftext|> like any token
    extra = {"head_dim": VLLM_HEAD_DIM} if rollout == "vllm" else {}
    make_tiny_model(model, seed=0, eos_token_id=IM_END, bos_token_id=None, **extra)
    chatml_tokenizer().save_pretrained(model)
    g = torch.Generator().manual_seed(11)
    rows = []
    for i in range(PROMPTS):
        ids = torch.randint(1, WORDS, (PROMPT_TOKENS,), generator=g).tolist()
        rows.append({"data_source": "tiny_parity", "prompt": [{"role": "user", "content": " ".join(f"t{x}" for x in ids)}],
                     "ability": "parity", "reward_model": {"style": "rule", "ground_truth": "any" if i % 4 == 3 else str(i % 2)},
                     "extra_info": {"index": i}})
    pd.DataFrame(rows[:48]).to_parquet(workdir / "train.parquet")
    pd.DataFrame(rows[48:]).to_parquet(workdir / "val.parquet")
    return {"model": model, "train": workdir / "train.parquet", "val": workdir / "val.parquet"}


REPLAY_MODES = {"off": "disabled", "R2": "R2", "R3": "R3"}


# rollouts that return the routed experts of what they generate on the CPU (vLLM's CPU build cannot:
# enable_return_routed_experts needs its Model Runner V2, which needs Triton)
ROUTES_ON_CPU = ("hf_cpu",)


def replay_overrides(router_replay: str | None, rollout_dtype: str | None = None, rollout: str = "hf_cpu") -> list[str]:
    """``--router-replay off|R2|R3``: verl's replay mode, and the rollout returning its routed experts
    where it can (replayed under R3; the routing-agreement metric otherwise). ``rollout_dtype``: the
    rollout's dtype."""
    from mcore_dapo.errors import UserError

    out = [f"actor_rollout_ref.rollout.dtype={rollout_dtype}"] if rollout_dtype else []
    if router_replay is None:
        return out
    if router_replay not in REPLAY_MODES:
        raise UserError(f"--router-replay={router_replay!r} is not accepted: accepted are {', '.join(REPLAY_MODES)}")
    if rollout not in ROUTES_ON_CPU:
        if router_replay == "R3":
            raise UserError(f"--router-replay R3 with --rollout {rollout}: R3 replays the rollout's routed experts, "
                            "which vLLM's CPU build cannot return (its Model Runner V2 needs Triton); accepted on "
                            "the CPU is --rollout hf_cpu")
        return [*out, f"actor_rollout_ref.actor.megatron.router_replay.mode={REPLAY_MODES[router_replay]}"]
    return [*out, f"actor_rollout_ref.actor.megatron.router_replay.mode={REPLAY_MODES[router_replay]}",
            "actor_rollout_ref.rollout.enable_rollout_routing_replay=True"]


def rollout_overrides(rollout: str) -> list[str]:
    """``hf_cpu`` (the plugin's HF stand-in) or verl's own ``vllm`` rollout on vLLM's CPU build."""
    r = "actor_rollout_ref.rollout"
    if rollout == "hf_cpu":
        return [f"{r}.name=hf_cpu"]
    return [f"{r}.name=vllm", f"{r}.enforce_eager=True", f"{r}.load_format=dummy",
            f"{r}.max_model_len={MAX_PROMPT + MAX_RESPONSE}", f"{r}.max_num_seqs={TRAIN_BSZ * N * 3}",
            f"{r}.max_num_batched_tokens={(MAX_PROMPT + MAX_RESPONSE) * TRAIN_BSZ * N * 3}",
            f"{r}.enable_chunked_prefill=False", f"{r}.enable_prefix_caching=False",
            f"{r}.checkpoint_engine.update_weights_bucket_megabytes=16",
            f"+{r}.enable_sleep_mode=False"]  # not in verl's rollout.yaml (a RolloutConfig field); vLLM's CPU platform refuses sleep mode (verl's default: on)


def overrides(files: dict, workdir: Path, steps: int, ep: int = 2, lr: float = 1e-3,
              rollout: str = "hf_cpu") -> list[str]:
    """The DAPO overrides of configs/dapo/common.sh, at tiny sizes, for 2 CPU processes."""
    a, r = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    layout = []
    for role in ("actor", "ref"):
        layout += [f"actor_rollout_ref.{role}.megatron.tensor_model_parallel_size=1",
                   f"actor_rollout_ref.{role}.megatron.pipeline_model_parallel_size=1",
                   f"actor_rollout_ref.{role}.megatron.expert_model_parallel_size={ep}",
                   f"actor_rollout_ref.{role}.megatron.expert_tensor_parallel_size=1"]
    return [
        f"data.train_files={files['train']}", f"data.val_files={files['val']}", "data.prompt_key=prompt",
        "data.truncation=left", f"data.max_prompt_length={MAX_PROMPT}", f"data.max_response_length={MAX_RESPONSE}",
        f"data.gen_batch_size={TRAIN_BSZ * 3}", f"data.train_batch_size={TRAIN_BSZ}", "data.dataloader_num_workers=0",
        f"{r}.n={N}", "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=False",
        "algorithm.kl_ctrl.kl_coef=0.0", f"{a}.use_kl_loss=False", f"{a}.kl_loss_coef=0.0",
        f"{a}.clip_ratio_low=0.2", f"{a}.clip_ratio_high=0.28", f"{a}.clip_ratio_c=10.0",
        "algorithm.filter_groups.enable=True", "algorithm.filter_groups.max_num_gen_batches=10",
        "algorithm.filter_groups.metric=acc",
        # Megatron's attention without Transformer Engine has no THD (packed) kernel: padded batches
        "actor_rollout_ref.model.use_remove_padding=False",
        f"{a}.use_dynamic_bsz=False", f"{a}.ppo_micro_batch_size_per_gpu=2",
        f"{r}.log_prob_micro_batch_size_per_gpu=4", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        f"actor_rollout_ref.model.path={files['model']}",
        f"{a}.optim.lr={lr}", f"{a}.optim.lr_warmup_steps=0", f"{a}.optim.weight_decay=0.1",
        f"{a}.ppo_mini_batch_size={TRAIN_BSZ}", f"{a}.entropy_coeff=0", f"{a}.optim.clip_grad=1.0",
        f"{a}.loss_agg_mode=token-mean", f"{a}.strategy=megatron", *layout,
        f"{a}.megatron.use_distributed_optimizer=False", f"{a}.megatron.dtype=bfloat16",
        *rollout_overrides(rollout), f"{r}.tensor_model_parallel_size=1", f"{r}.temperature=1.0", f"{r}.top_p=1.0",
        f"{r}.top_k=-1", f"{r}.val_kwargs.temperature=1.0", f"{r}.val_kwargs.top_p=0.7", f"{r}.val_kwargs.n=1",
        f"{r}.val_kwargs.do_sample=True", f"{r}.free_cache_engine=False", f"{r}.agent.num_workers=1",
        "reward.reward_manager.name=dapo",
        f"reward.custom_reward_function.path={Path(__file__).resolve()}",
        "reward.custom_reward_function.name=compute_score",
        f"+reward.reward_kwargs.max_resp_len={MAX_RESPONSE}",
        "+reward.reward_kwargs.overlong_buffer_cfg.enable=True",
        f"+reward.reward_kwargs.overlong_buffer_cfg.len={OVERLONG}",
        "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
        "+reward.reward_kwargs.overlong_buffer_cfg.log=False",
        "trainer.project_name=tiny_dapo", "trainer.experiment_name=megatron_ep2_cpu",
        "trainer.logger=[console,file]", "trainer.n_gpus_per_node=2", "trainer.nnodes=1", "trainer.device=cpu",
        "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=-1",
        f"trainer.total_training_steps={steps}", "trainer.total_epochs=100",
        f"trainer.default_local_dir={workdir / 'checkpoints'}", "trainer.resume_mode=disable",
        # Ray on a laptop: logical CPUs for verl's many small actors, two logical GPU slots for the two
        # trainer processes (the plugin's cpu platform counts trainer slots as Ray's GPU resource)
        "ray_kwargs.ray_init.num_cpus=32", "+ray_kwargs.ray_init.num_gpus=2",
        "+ray_kwargs.ray_init.include_dashboard=False", "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    ]


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def run(workdir: Path, steps: int, timeout: float, lr: float = 1e-3, audit: bool = False,
        rollout: str = "hf_cpu", router_replay: str | None = None, rollout_dtype: str | None = None) -> dict:
    """``audit``: every update is recomputed afterwards on the HF model from the engine's weights of
    that step (:mod:`mcore_dapo.verl_plugin.audit`); the result gets both gradient norms per step."""
    import shutil

    workdir = Path(workdir).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    audit_dir = workdir / "audit"
    shutil.rmtree(audit_dir, ignore_errors=True)
    files = prepare(workdir, rollout)
    log = workdir / "metrics.jsonl"
    log.unlink(missing_ok=True)
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(log), "RAY_DEDUP_LOGS": "0", "HYDRA_FULL_ERROR": "1",
           "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
    if audit:
        env["MCORE_DAPO_AUDIT_DIR"] = str(audit_dir)
    cmd = [sys.executable, "-m", "mcore_dapo.verl_plugin.main_dapo",
           *overrides(files, workdir, steps, lr=lr, rollout=rollout), *replay_overrides(router_replay, rollout_dtype, rollout)]
    t0 = time.time()
    with open(workdir / "train.log", "w") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout, cwd=workdir)
    records = read_metrics(log)
    result = {"returncode": proc.returncode, "rollout": rollout, "seconds": round(time.time() - t0, 1),
              "steps": len(records),
              "metrics_log": str(log), "train_log": str(workdir / "train.log"),
              "last": records[-1]["data"] if records else None}
    if records:
        result["plot"] = str(plot(workdir / "train.log", workdir / "tiny_dapo.png"))
    if audit and proc.returncode == 0:
        from mcore_dapo.harness.audit_reference import reference

        result["audit"] = reference(audit_dir)
    return result


def per_step(result: dict) -> list[dict]:
    """Per step: verl's score, the engine's grad norm, the audit's HF grad norm, verl's rollout-vs-actor max |dp|."""
    rows = [r["data"] for r in read_metrics(Path(result["metrics_log"]))]
    audit = result.get("audit") or []
    return [{"step": i + 1, "score": m.get("critic/score/mean"), "grad_norm": m.get("actor/grad_norm"),
             "reference_grad_norm": audit[i]["reference_grad_norm"] if i < len(audit) else None,
             "evicted": m.get("training/filter_groups/evicted_samples", 0),
             "rollout_vs_actor": m.get("training/rollout_probs_diff_max"),
             "routing_agreement": m.get("actor/routing/rollout_agreement"), "seconds": m.get("timing_s/step")}
            for i, m in enumerate(rows)]


def plot(train_log: Path, out: Path) -> Path:
    """Reward, response length, the guide's e2e throughput and the timing breakdown per step."""
    from mcore_dapo.metrics import Batch, read_run, with_throughputs
    from mcore_dapo.metrics.plot import plot_runs

    batch = Batch(world_size=2, prompts=TRAIN_BSZ, responses_per_prompt=N)
    return plot_runs({"tiny DAPO, Megatron EP2 (CPU)": with_throughputs(read_run(train_log), batch)}, out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mcore_dapo.harness.tiny_dapo")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--rollout", choices=ROLLOUTS, default="hf_cpu")
    ap.add_argument("--audit", action="store_true",
                    help="recompute every update on the HF model from the engine's weights of that step")
    ap.add_argument("--router-replay", choices=list(REPLAY_MODES), default=None,
                    help="router replay (off, R2, R3); the rollout returns its routed experts for the "
                         "routing-agreement metric (actor/routing/rollout_agreement)")
    ap.add_argument("--rollout-dtype", choices=["bfloat16", "float32"], default=None, help="the rollout's dtype")
    a = ap.parse_args(argv)
    result = run(Path(a.workdir).absolute(), a.steps, a.timeout, lr=a.lr, audit=a.audit, rollout=a.rollout,
                 router_replay=a.router_replay, rollout_dtype=a.rollout_dtype)
    print(json.dumps(result))
    return 0 if result["returncode"] == 0 and result["steps"] >= a.steps else 1


if __name__ == "__main__":
    sys.exit(main())
