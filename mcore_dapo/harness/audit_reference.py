"""Recompute the steps written by the engine's audit (:mod:`mcore_dapo.verl_plugin.audit`) on an HF model.

``python -m mcore_dapo.harness.audit_reference D [--dtype bfloat16]`` prints, for every ``D/step-N/``, the engine's
gradient norm and that of the same update computed in one process on the HF transformers model
loaded from the weights the engine wrote before that step. When the batch carries routed experts
(router replay R2/R3), the reference's routers are forced to them (:class:`ForcedRoutes`): the
same routing, with the gate weights computed from the reference's own router logits, as Megatron's
replay does. Each MoE router's gradient norm is given beside the engine's.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from mcore_dapo.verl_plugin.audit import FIELDS, ROUTES


class ForcedRoutes:
    """Forward hooks on an HF Qwen3-MoE model's routers: the top-k experts of the first ``len(routes)``
    tokens are those of ``routes`` (``[tokens, MoE layers, top_k]``); their weights are the router's
    softmax at those experts (renormalised over the k when ``norm_topk_prob``), as in Megatron's
    replay (top-k indices replaced, probabilities from the router's own scores). Later tokens (the
    one a rollout never fed back) keep their own routing. ``routes=None``: no forcing."""

    def __init__(self, model):
        from mcore_dapo.verl_plugin.rollout_cpu import moe_gates

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


def reference_step(folder: Path, force_routes: bool = True, dtype: torch.dtype = torch.float32) -> dict:
    """One audited update in one process (clip 0.2/0.28, clip_ratio_c 10, token-mean: the DAPO settings
    of :func:`mcore_dapo.harness.verl_dapo.actor_config` and of ``tiny_dapo``). ``force_routes=False``:
    the reference routes by itself even when the batch carries routes (for comparisons). ``dtype``:
    the HF model's (``torch.bfloat16`` shows how far bf16 rounding alone moves the loss)."""
    from transformers import AutoModelForCausalLM

    from mcore_dapo.harness.verl_dapo import actor_config
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    parts = [torch.load(f, weights_only=False) for f in sorted(folder.glob("rank*.pt"))]
    engine_norm = next(p["grad_norm"] for p in parts if p["grad_norm"] is not None)
    engine_routers = {}  # layer number -> norm (each pipeline stage has its own layers; TP/DP copies agree)
    for p in parts:
        engine_routers.update(p.get("router_grad_norms", {}))
    seqs, cols = [], {k: [] for k in FIELDS[1:]}
    for p in parts:  # the data-parallel ranks' shares, in rank order
        seqs += p["batch"]["input_ids"]
        for k in cols:
            cols[k] += p["batch"][k]
    routes = [r for p in parts for r in p["batch"].get(ROUTES, [])] if force_routes else None
    routes = routes or None
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
    cfg = actor_config(dp_size=1, batch_num_tokens=int(mask.sum()))
    loss, _ = get_policy_loss_fn("vanilla")(old_log_prob=old, log_prob=new, advantages=adv, response_mask=mask,
                                            loss_agg_mode="token-mean", config=cfg)
    loss.backward()
    norm = float(torch.sqrt(sum((p.grad.float() ** 2).sum() for p in model.parameters() if p.grad is not None)))
    routers = [float(g.weight.grad.float().norm()) for g in forced.gates]  # MoE layers in order, as the engine
    return {"step": folder.name, "engine_grad_norm": engine_norm, "reference_grad_norm": norm,
            "engine_router_grad_norms": _by_layer(engine_routers), "reference_router_grad_norms": routers,
            "reference_loss": float(loss), "sequences": len(seqs), "tokens": int(mask.sum()),
            "forced_routes": None if routes is None else [list(r.shape) for r in routes]}


def _by_layer(norms: dict) -> list[float]:
    """Router gradient norms in layer order (the MoE layers only: those with a router)."""
    return [norms[k] for k in sorted(norms)]


def reference(root: str | Path, dtype: torch.dtype = torch.float32) -> list[dict]:
    return [reference_step(f, dtype=dtype) for f in sorted(Path(root).glob("step-*")) if any(f.glob("rank*.pt"))]


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
