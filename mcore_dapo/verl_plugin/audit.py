"""Audit of verl's training steps on the plugin's engine against an HF transformers reference.

With ``MCORE_DAPO_AUDIT_DIR=D`` in the environment of verl's workers, every
``McoreDapoEngine.train_batch`` first writes the weights it is about to update (HF format, through
:class:`~mcore_dapo.verl_plugin.ckpt_bridge.CheckpointBridge`) and each rank's batch (tokens,
response mask, old log-probs, advantages) to ``D/step-N/``, then the gradient norm verl's
optimizer reports. :func:`reference` recomputes each step on the HF model loaded from those
weights in one process (verl's ``vanilla`` policy loss, token-mean over the mini-batch) and returns
both gradient norms: the engine's whole path (verl's micro-batching and loss scaling, Megatron's
schedules, EP all-to-all, DDP reduction, bf16) against a plain one-process computation.

For tiny models: the weights are written at every step.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

ENV = "MCORE_DAPO_AUDIT_DIR"
FIELDS = ("input_ids", "response_mask", "old_log_probs", "advantages")


def enabled() -> bool:
    return bool(os.environ.get(ENV))


def _pieces(v) -> list[torch.Tensor]:
    return [t.detach().cpu().clone() for t in (v.unbind() if getattr(v, "is_nested", False) else v)]


def audited_train_batch(engine, train_batch, data, loss_function):
    """``engine.train_batch`` with the weights before, the batch and the gradient norm written down."""
    import torch.distributed as dist

    root = Path(os.environ[ENV])
    step = getattr(engine, "_mcore_audit_step", 0)
    engine._mcore_audit_step = step + 1
    folder = root / f"step-{step:04d}"
    engine.bridge.save_weights(engine.module, folder / "hf")
    rank = dist.get_rank()
    if rank == 0:
        for name in ("config.json", "generation_config.json"):
            src = Path(engine.model_config.local_path) / name
            if src.is_file():
                shutil.copy(src, folder / "hf" / name)
    batch = {k: _pieces(data[k]) for k in FIELDS if k in data.keys()}
    out = train_batch(data, loss_function)
    grad_norm = out["metrics"].get("grad_norm") if out is not None and "metrics" in out else None
    torch.save({"batch": batch, "grad_norm": None if grad_norm is None else float(grad_norm)},
               folder / f"rank{rank:03d}.pt")
    return out


def _padded(pieces: list[torch.Tensor]) -> torch.Tensor:
    return torch.nn.utils.rnn.pad_sequence([p.float() for p in pieces], batch_first=True)


def reference_step(folder: Path) -> dict:
    """One audited update in one process (clip 0.2/0.28, clip_ratio_c 10, token-mean: the DAPO settings
    of :func:`mcore_dapo.verl_plugin.dapo_check.actor_config` and of ``tiny_dapo``)."""
    from transformers import AutoModelForCausalLM

    from mcore_dapo.verl_plugin.dapo_check import actor_config
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    parts = [torch.load(f, weights_only=False) for f in sorted(folder.glob("rank*.pt"))]
    engine_norm = next(p["grad_norm"] for p in parts if p["grad_norm"] is not None)
    seqs, cols = [], {k: [] for k in FIELDS[1:]}
    for p in parts:  # the data-parallel ranks' shares, in rank order
        seqs += p["batch"]["input_ids"]
        for k in cols:
            cols[k] += p["batch"][k]
    mask, old, adv = (_padded(cols[k]) for k in FIELDS[1:])
    model = AutoModelForCausalLM.from_pretrained(str(folder / "hf"), dtype=torch.float32,
                                                 attn_implementation="eager").train()
    new = torch.zeros_like(old)
    for i, s in enumerate(seqs):
        r, n = int(mask[i].sum()), s.shape[0]
        logits = model(input_ids=s[None]).logits[0].float()
        new[i, :r] = torch.log_softmax(logits[n - r - 1:n - 1], -1).gather(-1, s[n - r:, None]).squeeze(-1)
    cfg = actor_config(dp_size=1, batch_num_tokens=int(mask.sum()))
    loss, _ = get_policy_loss_fn("vanilla")(old_log_prob=old, log_prob=new, advantages=adv, response_mask=mask,
                                            loss_agg_mode="token-mean", config=cfg)
    loss.backward()
    norm = float(torch.sqrt(sum((p.grad.float() ** 2).sum() for p in model.parameters() if p.grad is not None)))
    return {"step": folder.name, "engine_grad_norm": engine_norm, "reference_grad_norm": norm,
            "reference_loss": float(loss), "sequences": len(seqs), "tokens": int(mask.sum())}


def reference(root: str | Path) -> list[dict]:
    return [reference_step(f) for f in sorted(Path(root).glob("step-*")) if any(f.glob("rank*.pt"))]


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m mcore_dapo.verl_plugin.audit")
    ap.add_argument("audit_dir")
    a = ap.parse_args(argv)
    print(json.dumps(reference(a.audit_dir)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
