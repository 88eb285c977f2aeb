"""Recompute the steps written by the engine's audit (:mod:`mcore_dapo.harness.audit`) on an HF model.

``python -m mcore_dapo.harness.audit_reference D [--dtype bfloat16]`` prints, for every ``D/step-N/``, the engine's
loss and gradient norm and those of the same update computed in one process on the HF transformers model
loaded from the weights the engine wrote before that step. When the batch carries routed experts
(router replay R2/R3), the reference's routers are forced to them (:class:`ForcedRoutes`): the
same routing, with the gate weights computed from the reference's own router logits, as Megatron's
replay does. Each MoE router's gradient norm is given beside the engine's.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from mcore_dapo.harness.audit import CORRECTION, FIELDS, KL, ROUTES


class ForcedRoutes:
    """Forward hooks on an HF Qwen3-MoE model's routers: the top-k experts of the first ``len(routes)``
    tokens are those of ``routes`` (``[tokens, MoE layers, top_k]``); their weights are the router's
    softmax at those experts (renormalised over the k when ``norm_topk_prob``), as in Megatron's
    replay (top-k indices replaced, probabilities from the router's own scores). Later tokens (the
    one a rollout never fed back) keep their own routing. ``routes=None``: no forcing."""

    def __init__(self, model):
        from mcore_dapo.verl_cpu.rollout import moe_gates

        self.gates = moe_gates(model)
        self.routes = None
        self.handles = [g.register_forward_hook(self._hook(i)) for i, g in enumerate(self.gates)]

    def _hook(self, layer):
        def hook(module, args, output):
            if self.routes is None:
                return None
            logits, scores, indices = output
            if self.routes.shape[1] != len(self.gates):
                raise ValueError(f"routes for {self.routes.shape[1]} layers, the model has {len(self.gates)} MoE layers")
            n = min(self.routes.shape[0], indices.shape[0])
            indices = indices.clone()
            indices[:n] = self.routes[:n, layer].to(indices.device, indices.dtype)
            probs = torch.softmax(logits, dim=-1, dtype=torch.float).gather(-1, indices)
            if module.norm_topk_prob:
                probs = probs / probs.sum(-1, keepdim=True)
            return logits, probs.to(logits.dtype), indices
        return hook

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def _padded(pieces: list[torch.Tensor]) -> torch.Tensor:
    return torch.nn.utils.rnn.pad_sequence([p.float() for p in pieces], batch_first=True)


def reference_step(folder: Path, force_routes: bool = True, dtype: torch.dtype = torch.float32,
                   grads: dict | None = None, settings: dict | None = None, routes_shift: int = 0) -> dict:
    """One audited update in one process (clip 0.2/0.28, clip_ratio_c 10, token-mean: the DAPO settings
    of :func:`mcore_dapo.harness.verl_dapo.actor_config` and of ``tiny_dapo``). ``force_routes=False``:
    the reference routes by itself even when the batch carries routes (for comparisons); ``routes_shift``: the
    routes moved by that many tokens (a token-order mutation the per-token check must see). ``dtype``:
    the HF model's (``torch.bfloat16`` shows how far bf16 rounding alone moves the loss)."""
    from transformers import AutoModelForCausalLM

    from mcore_dapo.harness.verl_dapo import actor_config
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    parts = [torch.load(f, weights_only=False) for f in sorted(folder.glob("rank*.pt"))]
    engine_norm = next(p["grad_norm"] for p in parts if p["grad_norm"] is not None)
    engine_loss = next((p["loss"] for p in parts if p.get("loss") is not None), None)  # a last pipeline stage's
    engine_routers = {}  # layer number -> norm (each pipeline stage has its own layers; TP/DP copies agree)
    for p in parts:
        engine_routers.update(p.get("router_grad_norms", {}))
    settings = {**LOSS_DEFAULTS, **(settings or {})}
    seqs, cols = [], {k: [] for k in (*FIELDS[1:], *CORRECTION, KL)}
    shares = {}  # each data-parallel rank's share once (its tensor- and pipeline-parallel ranks hold the same)
    for p in parts:
        shares.setdefault(p.get("dp_rank", len(shares)), p)
    for p in shares.values():  # the data-parallel ranks' shares, in rank order
        seqs += p["batch"]["input_ids"]
        for k in cols:
            cols[k] += p["batch"].get(k, [])
    routes = [r for p in shares.values() for r in p["batch"].get(ROUTES, [])] if force_routes else None
    routes = routes or None
    if routes is not None and routes_shift:  # a mutation: each token gets another token's routes
        routes = [r.roll(routes_shift, 0) for r in routes]
    mask, old, adv = (_padded(cols[k]) for k in FIELDS[1:])
    model = AutoModelForCausalLM.from_pretrained(str(folder / "hf"), dtype=dtype,
                                                 attn_implementation="eager").train()
    forced = ForcedRoutes(model)
    new = torch.zeros_like(old)
    for i, s in enumerate(seqs):
        r, n = int(mask[i].sum()), s.shape[0]
        forced.routes = None if routes is None else routes[i]
        logits = model(input_ids=s[None]).logits[0].float()
        new[i, :r] = torch.log_softmax(logits[n - r - 1:n - 1], -1).gather(-1, s[n - r:, None]).squeeze(-1)
    forced.close()
    valid = mask > 0
    # the engine's old log-probs were computed from the same weights the update starts from (one mini-batch:
    # verl's compute_log_prob before the update), on its routes: per token, the fp32 reference's log-probs of
    # the same tokens, with the routes the rollout returned forced on it, are within bf16 rounding of them
    logprob_diff = float((new.detach() - old).abs()[valid].max())
    weights = _padded(cols["rollout_is_weights"]) if cols["rollout_is_weights"] else None
    checks = {"logprob_max_abs_diff": logprob_diff}
    if weights is not None and cols["rollout_log_probs"]:
        # verl's token-level truncated IS weight, min(pi_old / pi_rollout, threshold), recomputed from the
        # reference's pi_old and the rollout's own log-probs
        rollout_lp = _padded(cols["rollout_log_probs"])
        ours = torch.exp(new.detach() - rollout_lp).clamp(max=float(settings["rollout_is_threshold"]))
        checks.update(is_weights_max_abs_diff=float((ours - weights).abs()[valid].max()),
                      is_weights_min=float(weights[valid].min()), is_weights_max=float(weights[valid].max()),
                      is_weights_off_one=float(((weights - 1).abs() > 1e-3)[valid].float().mean()))
    cfg = actor_config(dp_size=1, batch_num_tokens=int(mask.sum()))
    loss, _ = get_policy_loss_fn("vanilla")(old_log_prob=old, log_prob=new, advantages=adv, response_mask=mask,
                                            loss_agg_mode="token-mean", config=cfg, rollout_is_weights=weights)
    if settings["use_kl_loss"]:  # verl's ppo_loss (verl/workers/utils/losses.py): + coef * token-mean KL to the ref
        from verl.trainer.ppo.core_algos import agg_loss, kl_penalty

        if not cols[KL]:
            raise ValueError(f"{folder.name}: the KL loss is on but the batch holds no {KL}")
        kld = kl_penalty(logprob=new, ref_logprob=_padded(cols[KL]), kl_penalty=settings["kl_loss_type"])
        kl = agg_loss(loss_mat=kld, loss_mask=mask, loss_agg_mode="token-mean", dp_size=1,
                      batch_num_tokens=int(mask.sum()))
        loss = loss + float(settings["kl_loss_coef"]) * kl
        checks["reference_kl_loss"] = float(kl.detach())
    loss.backward()
    if grads is not None:  # the reference's gradients, by the HF model's parameter names
        grads.update({n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None})
    norm = float(torch.sqrt(sum((p.grad.float() ** 2).sum() for p in model.parameters() if p.grad is not None)))
    routers = [float(g.weight.grad.float().norm()) for g in forced.gates]  # MoE layers in order, as the engine
    return {"step": folder.name, "engine_grad_norm": engine_norm, "reference_grad_norm": norm, "engine_loss": engine_loss,
            "engine_router_grad_norms": _by_layer(engine_routers), "reference_router_grad_norms": routers,
            "reference_loss": float(loss.detach()), "sequences": len(seqs), "tokens": int(mask.sum()), **checks,
            "forced_routes": None if routes is None else [list(r.shape) for r in routes]}


# what the reference's loss needs of the run's settings where the run leaves them to verl's defaults
# (verl/trainer/config/actor/actor.yaml: use_kl_loss false, kl_loss_type low_var_kl;
# verl/trainer/config/algorithm/rollout_correction.yaml: rollout_is_threshold 2.0)
LOSS_DEFAULTS = {"use_kl_loss": False, "kl_loss_coef": 0.0, "kl_loss_type": "low_var_kl", "rollout_is_threshold": 2.0}


def _by_layer(norms: dict) -> list[float]:
    """Router gradient norms in layer order (the MoE layers only: those with a router)."""
    return [norms[k] for k in sorted(norms)]


class ReferenceAdam:
    """Megatron's optimizer step on the reference side, chained over the audited steps: fp32 main weights
    (at the first step the engine's bf16 weights, as Megatron's mixed-precision optimizer starts from its
    model's parameters), the global-norm clip, decoupled Adam (torch's AdamW, as Megatron's Adam) with
    Megatron's default weight-decay groups (none for 1-D parameters), the engine's settings and each step's
    learning rate (``rank*.pt``: ``optimizer``, ``lr``), fed with the reference's own gradients."""

    def __init__(self, model, settings: dict):
        self.main = {n: p.detach().float().clone().requires_grad_(True) for n, p in model.named_parameters()}
        decay = [t for t in self.main.values() if t.dim() >= 2]
        flat = [t for t in self.main.values() if t.dim() < 2]
        self.clip = settings["clip_grad"]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": settings["weight_decay"]},
                                      {"params": flat, "weight_decay": 0.0}], lr=0.0,
                                     betas=(settings["adam_beta1"], settings["adam_beta2"]), eps=settings["adam_eps"])

    def step(self, grads: dict, lr: float) -> None:
        for n, t in self.main.items():
            t.grad = grads[n].clone() if n in grads else torch.zeros_like(t)
        torch.nn.utils.clip_grad_norm_(list(self.main.values()), self.clip)  # Megatron's: coeff max/(norm+1e-6)
        for group in self.opt.param_groups:
            group["lr"] = lr
        self.opt.step()


def weights_after(folder: Path, adam: ReferenceAdam) -> dict:
    """The engine's weights after the update (``hf-after``, the engine's dtype) against the reference's
    main weights after the same step: the share of elements more than one step of the engine dtype's
    spacing away (rounding to it alone is half a step), the largest difference, and the share of the
    engine's weights the update moved (``hf`` against ``hf-after``)."""
    from mcore_dapo.bridge.models.qwen3.table import hub_slices
    from mcore_dapo.harness.verl_dapo import beyond_one_step
    from mcore_dapo.io.hf_reader import HFReader

    beyond = moved = total = 0
    worst = 0.0
    with HFReader(folder / "hf-after") as after, HFReader(folder / "hf") as pre:
        for name, main in adam.main.items():
            for hub, index in hub_slices(name, tuple(main.shape)).items():
                got, ref, start = after.get(hub), main.detach()[index], pre.get(hub)
                beyond += int(beyond_one_step(got, ref).sum())
                moved += int((got != start.to(got.dtype)).sum())
                total += got.numel()
                worst = max(worst, float((got.float() - ref).abs().max()))
    return {"weights_beyond_one_step": beyond / total, "weights_moved": moved / total,
            "weights_max_abs_diff": worst, "weights_compared": total}


def run_settings(root: Path) -> dict:
    """The loss settings of the run whose audit this is (``settings.json``, which :func:`mcore_dapo.harness.tiny_dapo.run`
    writes from the run's overrides), beside the steps or beside the folder a linked step comes from."""
    steps = sorted(root.glob("step-*"))
    for folder in [root, *({s.resolve().parent for s in steps[:1]})]:
        if (folder / "settings.json").is_file():
            return json.loads((folder / "settings.json").read_text())
    return {}


def reference(root: str | Path, dtype: torch.dtype = torch.float32, settings: dict | None = None) -> list[dict]:
    """Every audited step recomputed, and the optimizer step chained over them (:class:`ReferenceAdam`):
    the weights each update left compared with the reference's (:func:`weights_after`)."""
    from transformers import AutoModelForCausalLM

    out, adam = [], None
    if settings is None:
        settings = run_settings(Path(root))
    for f in sorted(Path(root).glob("step-*")):
        if not any(f.glob("rank*.pt")):
            continue
        grads: dict = {}
        r = reference_step(f, dtype=dtype, grads=grads, settings=settings)
        if (f / "hf-after").is_dir():
            part = torch.load(next(iter(sorted(f.glob("rank*.pt")))), weights_only=False)
            if adam is None:
                model = AutoModelForCausalLM.from_pretrained(str(f / "hf"), dtype=torch.float32)
                adam = ReferenceAdam(model, part["optimizer"])
                del model
            if len(part.get("lrs", [part["lr"]])) != 1:
                raise ValueError(f"{f.name}: the update made {len(part['lrs'])} optimizer steps (several mini-batches "
                                 "or epochs); the reference chains one step per audited update")
            adam.step(grads, part["lr"])
            r.update(lr=part["lr"], **weights_after(f, adam))
        out.append(r)
    return out


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m mcore_dapo.harness.audit_reference")
    ap.add_argument("audit_dir")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="the HF model's dtype")
    a = ap.parse_args(argv)
    print(json.dumps(reference(a.audit_dir, dtype=getattr(torch, a.dtype))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
