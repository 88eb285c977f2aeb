"""Recompute the steps written by the engine's audit (:mod:`mcore_dapo_checks.audit`) on an HF model.

``python -m mcore_dapo_checks.audit_reference D [--dtype bfloat16]`` prints, for every ``D/step-N/``, the engine's
loss and gradient norm and those of the same update computed in one process on the HF transformers model
loaded from the weights the engine wrote before that step. When the batch carries routed experts
(router replay R2/R3), the reference's routers are forced to them (:class:`ForcedRoutes`): the
same routing, with the gate weights computed from the reference's own router logits, as Megatron's
replay does. Without replay they are forced to the routes the engine's routers chose in the update's
forward (kept by the audit): a bf16 engine and an fp32 reference routing by themselves part at every
near-tie. Each MoE router's gradient norm is given beside the engine's.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from mcore_dapo_checks.audit import CORRECTION, FIELDS, KL, LOSS_MASK, ROUTES, part_of


# the HF model's parameters by part, as :data:`mcore_dapo_checks.audit.MEGATRON_PARTS` names the engine's; the first
# pattern that matches wins
HF_PARTS = (
    ("embeddings", r"embed_tokens\."),
    ("output layer", r"lm_head\."),
    ("norms", r"norm\."),
    ("routers", r"\.mlp\.gate\."),
    ("shared experts", r"\.mlp\.shared_expert"),
    ("experts", r"\.mlp\.experts\."),
    ("attention", r"\.self_attn\."),
    ("dense mlp", r"\.mlp\."),
)


def hf_part(name: str) -> str:
    return part_of(name, HF_PARTS)


def part_norms(tensors: dict[str, torch.Tensor]) -> dict[str, float]:
    """The norm of each part (:func:`hf_part`) over ``tensors`` by HF name."""
    sq: dict[str, float] = {}
    for n, t in tensors.items():
        part = hf_part(n)
        sq[part] = sq.get(part, 0.0) + float((t.float() ** 2).sum())
    return {k: math.sqrt(v) for k, v in sq.items()}


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
        self.sequence = 0  # which sequence the next forward is (its router logits are kept by (sequence, layer))
        self.logits: dict[tuple[int, int], torch.Tensor] = {}
        # (sequence, layer) -> (token indices, forced routes) where the forced experts are not the router's own
        self.differ: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self.same = self.total = 0  # forced (token, layer) pairs whose experts the router would have chosen itself
        self.top_k = None
        self.handles = [g.register_forward_hook(self._hook(i)) for i, g in enumerate(self.gates)]

    def _hook(self, layer):
        def hook(module, args, output):
            if self.routes is None:
                return None
            logits, scores, indices = output
            if self.routes.shape[1] != len(self.gates):
                raise ValueError(f"routes for {self.routes.shape[1]} layers, the model has {len(self.gates)} MoE layers")
            n = min(self.routes.shape[0], indices.shape[0])
            self.top_k = indices.shape[-1]
            forced = self.routes[:n, layer].to(indices.device, indices.dtype)
            ordered = torch.sort(forced, dim=-1).values
            same = (torch.sort(indices[:n], dim=-1).values == ordered).all(-1)
            # a row naming one expert twice is no router's choice: a position the rollout returned no routes for
            # (R3's placeholder rows, zeros); forced as given, left out of the agreement and the near-ties
            chosen = (ordered.diff(dim=-1) != 0).all(-1)
            self.same += int((same & chosen).sum())
            self.total += int(chosen.sum())
            self.logits[(self.sequence, layer)] = logits[:n].detach().float()
            differ = ~same & chosen
            if bool(differ.any()):
                self.differ[(self.sequence, layer)] = (differ.nonzero().squeeze(-1), forced[differ])
            indices = indices.clone()
            indices[:n] = forced
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
                   grads: dict | None = None, settings: dict | None = None, routes_offset: int = 0,
                   rollout_log_prob_shift: float = 0.0,
                   routing: dict | None = None, route_bias: tuple[int, float, str] | None = None,
                   log_probs: dict | None = None, rounding_draw: int | None = None) -> dict:
    """One audited update in one process (clip 0.2/0.28, clip_ratio_c 10, token-mean: the DAPO settings
    of :func:`mcore_dapo_checks.verl_dapo.actor_config` and of ``tiny_dapo``). ``force_routes=False``:
    the reference routes by itself even when the batch carries routes (for comparisons). Mutations the checks must
    see: ``routes_offset``, every replayed expert index moved by that many (expert e to e + offset modulo the
    experts: what mixing up expert-parallel ranks' local and global expert indices gives);
    ``rollout_log_prob_shift``, the rollout's log-probs moved by that much before the importance weights are
    recomputed from them. ``dtype``:
    the HF model's (``torch.bfloat16`` shows how far bf16 rounding alone moves the loss and the gradient).
    ``routing``: filled with the routers' logits by (sequence, layer) and the (token, layer) pairs whose forced routes
    are not the router's own, and the engine's router logits where it kept them (:func:`near_ties`).
    ``route_bias=(expert, raise, where)``, a mutation of the engine's kept routes (an engine whose router had a
    per-expert bias): ``where="selection"``, the routes are the top-k of the engine's logits with that expert's raised
    (a bias added where the experts are picked), ``"logits"``, the engine's logits themselves raised and the routes
    their top-k (a bias in the router's output).
    ``log_probs``: gets this model's log-probs of the response tokens (``new``, flattened). ``rounding_draw``: a seed;
    the embeddings' output is moved by at most one bf16 spacing at random (:func:`perturb_embeddings`), so that a bf16
    model rounds every later step of the same computation otherwise (one more draw of bf16's rounding, reference())."""
    from transformers import AutoModelForCausalLM

    from mcore_dapo_checks.verl_dapo import actor_config
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    parts = [torch.load(f, weights_only=False) for f in sorted(folder.glob("rank*.pt"))]
    engine_norm = next(p["grad_norm"] for p in parts if p["grad_norm"] is not None)
    engine_loss = next((p["loss"] for p in parts if p.get("loss") is not None), None)  # a last pipeline stage's
    engine_routers = {}  # layer number -> norm (each pipeline stage has its own layers; TP/DP copies agree)
    for p in parts:
        engine_routers.update(p.get("router_grad_norms", {}))
    settings = {**LOSS_DEFAULTS, **(settings or {})}
    seqs, cols = [], {k: [] for k in (*FIELDS[1:], *CORRECTION, KL, LOSS_MASK)}
    shares = {}  # each data-parallel rank's share once (its tensor- and pipeline-parallel ranks hold the same)
    for p in parts:
        shares.setdefault(p.get("dp_rank", len(shares)), p)
    for p in shares.values():  # the data-parallel ranks' shares, in rank order
        seqs += p["batch"]["input_ids"]
        for k in cols:
            cols[k] += p["batch"].get(k, [])
    routes = [r for p in shares.values() for r in p["batch"].get(ROUTES, [])] if force_routes else None
    routes, routes_from = routes or None, "batch"
    engine_logits = None
    if routes is None and force_routes and any(p.get("engine_routes") for p in parts):
        routes, engine_logits = _engine_routes(folder, parts, seqs)
        routes_from = "engine"
        if route_bias is not None:
            routes, engine_logits = _biased_routes(engine_logits, routes, *route_bias)
    elif route_bias is not None:
        raise ValueError(f"{folder.name}: route_bias mutates the engine's kept routes; this update has none")
    mask, old, adv = (_padded(cols[k]) for k in FIELDS[1:])
    model = AutoModelForCausalLM.from_pretrained(str(folder / "hf"), dtype=dtype,
                                                 attn_implementation="eager").train()
    if rounding_draw is not None:
        perturb_embeddings(model, rounding_draw)
    if routes is not None and routes_offset:  # a mutation: every token routed to other experts
        routes = [(r + routes_offset) % model.config.num_experts for r in routes]
    forced = ForcedRoutes(model)
    new = torch.zeros_like(old)
    for i, s in enumerate(seqs):
        r, n = int(mask[i].sum()), s.shape[0]
        forced.routes = None if routes is None else routes[i]
        forced.sequence = i
        logits = model(input_ids=s[None]).logits[0].float()
        new[i, :r] = torch.log_softmax(logits[n - r - 1:n - 1], -1).gather(-1, s[n - r:, None]).squeeze(-1)
    forced.close()
    if routing is not None:
        routing.update(logits=forced.logits, differ=forced.differ, top_k=forced.top_k)
        if engine_logits is not None:
            routing["engine_logits"] = {(i, layer): engine_logits[i][:l32.shape[0], layer]
                                        for (i, layer), l32 in forced.logits.items()}
    valid = mask > 0
    bypass = bool(settings.get("bypass_mode"))
    # the engine's log-probs of the update's own forward (the audit keeps them where verl's loss takes them) and,
    # where verl recomputed the old policy, its old log-probs: both from the weights the update starts from (one
    # mini-batch), on its routes. Per token, the fp32 reference's log-probs of the same tokens, with the same routes
    # forced on it, are within bf16 rounding of them. That rounding is relative: a token of log-prob -11.5 (logits
    # of size ~10, where bf16's spacing is 1/16) came out 0.040 off, near-certain tokens at most 0.028; the scaled
    # difference |ref - engine| / (1 + |engine|) bounds both. In bypass mode the old log-probs are the rollout's
    # (verl copies them: checked exact below), of the weights that generated the samples, no engine's
    update = _update_log_probs(folder, parts, seqs, mask)
    engine = {k: lp for k, lp in (("update", update), ("old", None if bypass else old)) if lp is not None}
    if not engine:
        raise ValueError(f"{folder.name}: bypass mode and the audit kept no log-probs of the update's forward")
    ref = new.detach()
    checks = {"logprob_max_abs_diff": max(float((ref - lp).abs()[valid].max()) for lp in engine.values()),
              "logprob_max_scaled_diff": max(float(_scaled_diff(ref, lp)[valid].max()) for lp in engine.values()),
              # how far the engine's rounding moved the log-probs of the forward its gradient came from (the
              # update's; audits without it: the old-log-prob pass) from this model's, over the batch (with the bf16
              # model's the same, reference(): the engine's rounding against the bf16 recomputation's)
              "logprob_rms_diff": float((ref - next(iter(engine.values())))[valid].pow(2).mean().sqrt()),
              "logprobs_of": list(engine)}
    rollout = _padded(cols["rollout_log_probs"]) if cols["rollout_log_probs"] else None
    rollout_lp = None if rollout is None else rollout + rollout_log_prob_shift  # the mutation's shift, if any
    if bypass:
        # verl 0.9.1's bypass (verl/trainer/ppo/v1/trainer_base.py, _compute_old_log_prob): old_log_probs is the
        # rollout's log-probs, copied
        checks["old_vs_rollout_max_abs_diff"] = None if rollout is None else float((old - rollout).abs()[valid].max())
    if rollout_lp is not None:
        # the rollout's own log-probs against this model's at the update's weights, scaled as above: within rounding
        # where the samples are of those weights (a rollout holding other weights is off by tenths); of an older
        # policy's otherwise
        checks["rollout_logprob_max_scaled_diff"] = float(_scaled_diff(ref, rollout_lp)[valid].max())
    if log_probs is not None:
        log_probs["new"] = new.detach()[valid]
    weights = _padded(cols["rollout_is_weights"]) if cols["rollout_is_weights"] else None
    if weights is not None and rollout_lp is not None:
        # verl's token-level truncated IS weight, min(pi_old / pi_rollout, threshold): recomputed from the engine's
        # pi_old and the rollout's own log-probs, the inputs verl had (checked: the engine's pi_old against the
        # reference's above), it is the weight verl applied up to float rounding; from the reference's pi_old, within
        # bf16's rounding of it (reported)
        threshold = float(settings["rollout_is_threshold"])
        ours = torch.exp(new.detach() - rollout_lp).clamp(max=threshold)
        from_engine = torch.exp(old - rollout_lp).clamp(max=threshold)
        checks.update(is_weights_max_abs_diff=float((ours - weights).abs()[valid].max()),
                      is_weights_vs_engine_max_abs_diff=float((from_engine - weights).abs()[valid].max()),
                      is_weights_min=float(weights[valid].min()), is_weights_max=float(weights[valid].max()),
                      is_weights_off_one=float(((weights - 1).abs() > 1e-3)[valid].float().mean()))
    # the token-mean's denominator as verl 0.9.1 counts it: the loss mask its agent loop stored at rollout time
    # (verl/trainer/ppo/v1/agent_loop_tq.py), which the rollout correction's rejection sampling does not update
    # (it zeroes response_mask only): a rejected response's tokens leave the sum and stay in the denominator
    # (audits without the loss mask: every response token, as that mask holds for single-turn responses)
    denominator = int(sum(int(m.sum()) for m in cols[LOSS_MASK])) if cols[LOSS_MASK] else \
        int(sum(m.numel() for m in cols["response_mask"]))
    checks["rejected_tokens"] = denominator - int(mask.sum())
    cfg = actor_config(dp_size=1, batch_num_tokens=denominator)
    if settings["use_kl_loss"] and not cols[KL]:
        raise ValueError(f"{folder.name}: the KL loss is on but the batch holds no {KL}")
    ref_lp = _padded(cols[KL]) if settings["use_kl_loss"] else None

    def token_mean_loss(rows: slice, log_prob: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        # verl's policy loss over these rows with the whole batch's denominator (a token-mean is a sum over
        # rows: the batch's loss is the sum of its rows' losses), + coef * token-mean KL to the ref as verl's
        # ppo_loss (verl/workers/utils/losses.py) where the KL loss is on
        from verl.trainer.ppo.core_algos import agg_loss, kl_penalty

        w = None if weights is None else weights[rows]
        policy, _ = get_policy_loss_fn("vanilla")(old_log_prob=old[rows], log_prob=log_prob, advantages=adv[rows],
                                                  response_mask=mask[rows], loss_agg_mode="token-mean", config=cfg,
                                                  rollout_is_weights=w)
        if ref_lp is None:
            return policy, None
        kld = kl_penalty(logprob=log_prob, ref_logprob=ref_lp[rows], kl_penalty=settings["kl_loss_type"])
        kl = agg_loss(loss_mat=kld, loss_mask=mask[rows], loss_agg_mode="token-mean", dp_size=1,
                      batch_num_tokens=denominator)
        return policy + float(settings["kl_loss_coef"]) * kl, kl

    loss, kl = token_mean_loss(slice(None), new)
    if kl is not None:
        checks["reference_kl_loss"] = float(kl.detach())
    # the same loss on the engine's own log-probs of the update's forward (audits without them: its old log-probs,
    # the ratio 1 wherever the update's forward repeats the old-log-prob pass): the aggregation (token-mean
    # denominator, weights, advantages, KL) apart from the reference's rounding
    checks["loss_at_engine_log_probs"] = float(token_mean_loss(slice(None), old if update is None else update)[0])
    loss.backward()
    if grads is not None:  # the reference's gradients, by the HF model's parameter names
        grads.update({n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None})
    norm = float(torch.sqrt(sum((p.grad.float() ** 2).sum() for p in model.parameters() if p.grad is not None)))
    routers = [float(g.weight.grad.float().norm()) for g in forced.gates]  # MoE layers in order, as the engine
    engine_parts = next((p["part_grad_norms"] for p in parts if p.get("part_grad_norms")), None)
    return {"step": folder.name, "engine_grad_norm": engine_norm, "reference_grad_norm": norm, "engine_loss": engine_loss,
            "engine_part_grad_norms": engine_parts,
            "reference_part_grad_norms": part_norms({n: p.grad for n, p in model.named_parameters()
                                                     if p.grad is not None}),
            "engine_router_grad_norms": _by_layer(engine_routers), "reference_router_grad_norms": routers,
            "reference_loss": float(loss.detach()), "sequences": len(seqs), "tokens": int(mask.sum()), **checks,
            "forced_routes": None if routes is None else [list(r.shape) for r in routes],
            "routes_from": None if routes is None else routes_from,
            # how many of the forced (token, layer) routes the reference's own router picks too: the rest are the
            # tokens whose router scores tie within the engine's rounding (a route mixed up is far below 1)
            "routes_native_agreement": forced.same / forced.total if forced.total else None,
            # the engine's own routes against the logits its routers chose them from: a bias, a mask or another
            # index where the experts are picked makes a route that is no top-k of them (None: logits not kept)
            "routes_not_engine_top_k": None if engine_logits is None else not_top_k(engine_logits, routes)[0]}


# how far perturb_embeddings moves each element of the embeddings' output, relative: bf16 keeps 8 significant bits,
# so its spacing is 2^-7 to 2^-8 of the value; a move of up to 2^-7 rounds to a neighbour about half the time (a move
# under half a spacing, 2^-9, would round back to the same value everywhere: no other draw at all)
EMBEDDING_MOVE = 2.0 ** -7


def perturb_embeddings(model, seed: int) -> None:
    """The model's embeddings' output, each element times 1 + u with u uniform in +-EMBEDDING_MOVE (a generator
    seeded with ``seed``), rounded back to the model's dtype: an input to the rest of the model within one bf16
    spacing of the exact one, whose rounding at every later step differs from the unperturbed forward's."""
    generator = torch.Generator().manual_seed(seed)

    def hook(module, args, out):
        u = (torch.rand(out.shape, generator=generator, dtype=torch.float32) * 2 - 1) * EMBEDDING_MOVE
        return (out.float() * (1 + u.to(out.device))).to(out.dtype)

    model.get_input_embeddings().register_forward_hook(hook)


def _engine_routes(folder: Path, parts: list[dict], seqs: list[torch.Tensor]) -> tuple[list, list | None]:
    """The routes the engine's routers chose in the update's forward (:mod:`mcore_dapo_checks.audit`, kept where the
    batch has none to replay), per sequence of the batch ``[tokens, MoE layers, top_k]``: each rank wrote the
    layers it holds for the sequences it ran; with the router logits they were chosen from, per sequence
    ``[tokens, MoE layers, experts]`` (None where a router's were not kept)."""
    merged: dict[tuple, dict] = {}
    for p in parts:
        for ids, layers in (p.get("engine_routes") or {}).items():
            merged.setdefault(ids, {}).update(layers)
    routes, logits = [], []
    for s in seqs:
        layers = merged.get(tuple(s.tolist()))
        if layers is None:
            raise ValueError(f"{folder.name}: the engine kept no routes for a sequence of the batch "
                             f"({s.shape[0]} tokens)")
        kept = [layers[n] if isinstance(layers[n], tuple) else (layers[n], None) for n in sorted(layers)]
        routes.append(torch.stack([r for r, _ in kept], dim=1).long())
        logits.append(None if any(lg is None for _, lg in kept) else torch.stack([lg for _, lg in kept], dim=1))
    return routes, (None if any(lg is None for lg in logits) else logits)


def _scaled_diff(ref: torch.Tensor, lp: torch.Tensor) -> torch.Tensor:
    """|ref - lp| / (1 + |lp|) per token: bf16's rounding of a log-prob is relative to its size (reference_step)."""
    return (ref - lp).abs() / (1 + lp.abs())


def _update_log_probs(folder: Path, parts: list[dict], seqs: list[torch.Tensor], mask: torch.Tensor):
    """The log-probs of the update's own forward (:func:`mcore_dapo_checks.audit.keep_log_probs`, by sample), laid
    out as the batch's old log-probs; None for audits that kept none."""
    kept: dict[tuple, torch.Tensor] = {}
    for p in parts:
        kept.update(p.get("update_log_probs") or {})
    if not kept:
        return None
    out = torch.zeros_like(mask, dtype=torch.float32)
    for i, s in enumerate(seqs):
        lp = kept.get(tuple(s.tolist()))
        if lp is None:
            raise ValueError(f"{folder.name}: the update's forward kept no log-probs for a sequence of the batch")
        r = int(mask[i].sum())
        out[i, :r] = lp[:r]
    return out


def _biased_routes(logits: list | None, routes: list, expert: int, raise_by: float, where: str) -> tuple[list, list]:
    """A per-expert bias in the engine's router (:func:`reference_step`'s ``route_bias``): its routes and logits."""
    if logits is None:
        raise ValueError("route_bias needs the engine's router logits; this update kept routes only")
    if where not in ("selection", "logits"):
        raise ValueError(f"route_bias where={where!r}: 'selection' or 'logits'")
    k = routes[0].shape[-1]
    out_routes, out_logits = [], []
    for lg in logits:
        biased = lg.clone()
        biased[..., expert] += raise_by
        out_routes.append(torch.sort(biased.topk(k, dim=-1).indices, dim=-1).values)
        out_logits.append(biased if where == "logits" else lg)
    return out_routes, out_logits


def not_top_k(logits: list, routes: list) -> tuple[int, int]:
    """How many (token, layer) routes are not a top-k of the router logits they were chosen from (the smallest
    chosen logit below the largest left out; exact, ties allowed), of how many."""
    bad = total = 0
    for lg, r in zip(logits, routes):
        chosen = torch.zeros(lg.shape, dtype=torch.bool).scatter_(-1, r.long(), True)
        low = lg.masked_fill(~chosen, float("inf")).min(-1).values
        high = lg.masked_fill(chosen, float("-inf")).max(-1).values
        bad += int((low < high).sum())
        total += low.numel()
    return bad, total


# what the reference's loss needs of the run's settings where the run leaves them to verl's defaults
# (verl/trainer/config/actor/actor.yaml: use_kl_loss false, kl_loss_type low_var_kl;
# verl/trainer/config/algorithm/rollout_correction.yaml: rollout_is_threshold 2.0, bypass_mode false)
LOSS_DEFAULTS = {"use_kl_loss": False, "kl_loss_coef": 0.0, "kl_loss_type": "low_var_kl", "rollout_is_threshold": 2.0,
                 "bypass_mode": False}


def _by_layer(norms: dict) -> list[float]:
    """Router gradient norms in layer order (the MoE layers only: those with a router)."""
    return [norms[k] for k in sorted(norms)]


class ReferenceAdam:
    """Megatron's optimizer step on the reference side, chained over the audited steps: fp32 main weights
    (at the first step the engine's bf16 weights, as Megatron's mixed-precision optimizer starts from its
    model's parameters), the global-norm clip, decoupled Adam (torch's AdamW, as Megatron's Adam) with
    Megatron's default weight-decay groups (none for 1-D parameters), the settings and each step's learning
    rate the launch configured (:func:`planned_update`), fed with the reference's own gradients."""

    def __init__(self, model, settings: dict):
        self.main = {n: p.detach().float().clone().requires_grad_(True) for n, p in model.named_parameters()}
        decay = [t for t in self.main.values() if t.dim() >= 2]
        flat = [t for t in self.main.values() if t.dim() < 2]
        self.clip = settings["clip_grad"]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": settings["weight_decay"]},
                                      {"params": flat, "weight_decay": 0.0}], lr=0.0,
                                     betas=(settings["adam_beta1"], settings["adam_beta2"]), eps=settings["adam_eps"])

    def configure(self, settings: dict) -> None:
        """This step's settings (a resumed run's launch may give other ones than the first run's)."""
        self.clip = settings["clip_grad"]
        for group in self.opt.param_groups:
            group["betas"], group["eps"] = (settings["adam_beta1"], settings["adam_beta2"]), settings["adam_eps"]
        self.opt.param_groups[0]["weight_decay"] = settings["weight_decay"]  # the 1-D parameters' group stays at 0

    def step(self, grads: dict, lr: float) -> None:
        for n, t in self.main.items():
            t.grad = grads[n].clone() if n in grads else torch.zeros_like(t)
        torch.nn.utils.clip_grad_norm_(list(self.main.values()), self.clip)  # Megatron's: coeff max/(norm+1e-6)
        for group in self.opt.param_groups:
            group["lr"] = lr
        self.opt.step()


def weights_after(folder: Path, adam: ReferenceAdam, adam_bf16: ReferenceAdam | None = None) -> dict:
    """The engine's weights after the update (``hf-after``, the engine's dtype) against the reference's
    main weights after the same step: the share of elements more than one step of the engine dtype's
    spacing away (rounding to it alone is half a step), the largest difference, and the share of the
    engine's weights the update moved (``hf`` against ``hf-after``). With ``adam_bf16`` (the same chain fed
    with the bf16 HF reference's gradients) an element is beyond, and its difference counted, only where it is
    so from both chains: where bf16 rounding alone moves the gradient (:func:`reference`) the engine, a bf16
    model, may follow either; elsewhere the two chains agree and the check is the fp32 chain's
    (``weights_beyond_one_step_fp32``: against that chain alone)."""
    import json

    from mcore_dapo.bridge.models import get_model
    from mcore_dapo_checks.verl_dapo import beyond_one_step
    from mcore_dapo.io.hf_reader import HFReader

    hub_slices = get_model(json.loads((folder / "hf" / "config.json").read_text())).hub_slices
    beyond = beyond_fp32 = moved = total = 0
    worst = 0.0
    with HFReader(folder / "hf-after") as after, HFReader(folder / "hf") as pre:
        for name, main in adam.main.items():
            for hub, index in hub_slices(name, tuple(main.shape)).items():
                got, ref, start = after.get(hub), main.detach()[index], pre.get(hub)
                off, diff = beyond_one_step(got, ref), (got.float() - ref).abs()
                beyond_fp32 += int(off.sum())
                if adam_bf16 is not None:
                    ref16 = adam_bf16.main[name].detach()[index]
                    off = off & beyond_one_step(got, ref16)
                    diff = torch.minimum(diff, (got.float() - ref16).abs())
                beyond += int(off.sum())
                moved += int((got != start.to(got.dtype)).sum())
                total += got.numel()
                worst = max(worst, float(diff.max()))
    return {"weights_beyond_one_step": beyond / total, "weights_beyond_one_step_fp32": beyond_fp32 / total,
            "weights_moved": moved / total, "weights_max_abs_diff": worst, "weights_compared": total}


def run_settings(root: Path) -> dict:
    """The loss settings of the run whose audit this is (``settings.json``, which :func:`mcore_dapo_checks.tiny_dapo.run`
    writes from the run's overrides), beside the steps or beside the folder a linked step comes from."""
    steps = sorted(root.glob("step-*"))
    for folder in [root, *({s.resolve().parent for s in steps[:1]})]:
        if (folder / "settings.json").is_file():
            return json.loads((folder / "settings.json").read_text())
    return {}


# What the launch configured for Megatron's optimizer: read from the run's own command line and verl's config,
# never from the engine's objects, so that a setting lost or changed on its way from verl's config to Megatron
# shows as a difference.

HYDRA_OVERRIDES = "outputs/*/*/.hydra/overrides.yaml"  # verl's @hydra.main run folder, under the run's cwd
SETTINGS = ("adam_beta1", "adam_beta2", "adam_eps", "weight_decay", "clip_grad")
DECAY_STYLES = ("constant", "linear", "cosine")


def launch_overrides(step: Path) -> list[str] | None:
    """The overrides verl's trainer ran the audited update ``step`` with: Hydra's record of the command line
    (verl's ``main_ppo`` is a ``@hydra.main``, which writes ``outputs/<date>/<time>/.hydra/overrides.yaml`` under
    the run's working folder, the audit folder's parent), the newest one written before the update's folder was
    last written (a working folder may hold several runs: a killed one and its resumed one). ``None`` where no
    run left one (an audit made outside verl's trainer)."""
    from omegaconf import OmegaConf

    real = Path(step).resolve()
    done = real.stat().st_mtime
    found = [p for p in real.parent.parent.glob(HYDRA_OVERRIDES) if p.stat().st_mtime <= done]
    if not found:
        return None
    return [str(x) for x in OmegaConf.load(max(found, key=lambda p: p.stat().st_mtime))]


def configured_optimizer(overrides: list[str]) -> dict:
    """Megatron's optimizer settings and LR schedule that a launch with ``overrides`` configures. The overrides
    are composed with verl's ``ppo_trainer`` config as verl's main composes them
    (:func:`mcore_dapo.verl_plugin.main_dapo.compose`); ``actor_rollout_ref.actor.optim`` goes through verl's own
    mapping onto Megatron's ``OptimizerConfig`` (``verl/utils/megatron/optimizer.py``,
    ``init_megatron_optim_config``: it hands over lr, min_lr, clip_grad, weight_decay and
    ``override_optimizer_config``, and leaves Adam's betas and eps at ``OptimizerConfig``'s defaults); the
    schedule's steps are derived as that file's ``get_megatron_optimizer_param_scheduler`` derives them (the
    decay over the run's total steps where ``lr_decay_steps`` is unset, the warm-up from
    ``lr_warmup_steps_ratio`` where ``lr_warmup_steps`` is not positive), with the total steps verl's trainer
    injects (``trainer.total_training_steps``). ``config_betas``: verl's ``optim.betas``, which that mapping
    does not read."""
    import contextlib
    import io


    from mcore_dapo.verl_plugin.main_dapo import compose
    from mcore_dapo.verl_plugin.overrides import rewrite

    c = compose(rewrite(list(overrides)))
    optim = c.actor_rollout_ref.actor.optim
    total = c.trainer.get("total_training_steps")
    if total is None:
        raise ValueError("trainer.total_training_steps is unset: the audit cannot know the length of the LR "
                         "schedule verl derives from the dataloader")
    from verl.utils.megatron.optimizer import init_megatron_optim_config

    with contextlib.redirect_stdout(io.StringIO()):  # it prints the settings (print_rank_0)
        m = init_megatron_optim_config(optim, use_distributed_optimizer=bool(
            c.actor_rollout_ref.actor.megatron.get("use_distributed_optimizer", True)))
    decay = optim.get("lr_decay_steps")
    decay = int(total) if decay is None else int(decay)
    warmup = optim.get("lr_warmup_steps")
    ratio = optim.get("lr_warmup_steps_ratio")
    if ratio is not None and (warmup is None or warmup <= 0):
        warmup = int(ratio * decay)
    out = {k: float(getattr(m, k)) for k in SETTINGS}
    out.update(lr=float(m.lr), min_lr=float(m.min_lr if m.min_lr is not None else 0.0),
               lr_warmup_init=float(optim.lr_warmup_init), lr_warmup_steps=int(warmup or 0), lr_decay_steps=decay,
               lr_decay_style=str(optim.lr_decay_style), config_betas=[float(b) for b in optim.betas],
               overridden=sorted(str(k) for k in (optim.get("override_optimizer_config") or {}).keys()))
    return out


def scheduled_lr(s: dict, update: int) -> float:
    """The learning rate Megatron's ``OptimizerParamScheduler`` gives update ``update`` (0-based: the scheduler
    is built at step 0 and moves one step after each update) under the schedule ``s``
    (:func:`configured_optimizer`): a linear warm-up from ``lr_warmup_init``, then constant, linear or cosine
    decay to ``min_lr`` at ``lr_decay_steps``."""
    warm, start, top, low = s["lr_warmup_steps"], s["lr_warmup_init"], s["lr"], s["min_lr"]
    style = s["lr_decay_style"]
    if style not in DECAY_STYLES:
        raise ValueError(f"lr_decay_style {style!r}: the audit's reference schedules {', '.join(DECAY_STYLES)}")
    if warm > 0 and update <= warm:
        return start + (top - start) * update / warm
    if style == "constant":
        return top
    if update > s["lr_decay_steps"]:
        return low
    ratio = (update - warm) / (s["lr_decay_steps"] - warm)
    coeff = 1.0 - ratio if style == "linear" else 0.5 * (math.cos(math.pi * ratio) + 1.0)
    return low + coeff * (top - low)


def update_number(step: Path) -> int:
    """The audited update's number in the whole training (0-based): its number in its run's audit, after the
    steps of the checkpoint that run loaded (``checkpoint-load-<global step>``, one update a step)."""
    real = Path(step).resolve()
    loads = [int(p.name.rsplit("-", 1)[1]) for p in real.parent.glob("checkpoint-load-*")]
    return (max(loads) if loads else 0) + int(real.name.split("-")[1])


def optimizer_failures(expected: dict, engine: dict, lr_expected: float, lr_engine: float | None) -> list[str]:
    """Each way the engine's optimizer differs from what the launch configured, one line each: an Adam
    setting, the weight decay its parameter groups apply (``group_weight_decays``: the configured one and 0
    for Megatron's no-decay group), the learning rate of the update, and verl's ``optim.betas`` where they do
    not reach Megatron."""
    out = [f"{k}: the engine's optimizer has {engine.get(k)!r}, the launch configured {expected[k]!r}"
           for k in SETTINGS if engine.get(k) != expected[k]]
    groups = engine.get("group_weight_decays")
    if groups is not None and (set(groups) - {0.0, expected["weight_decay"]} or expected["weight_decay"] not in groups):
        out.append(f"group_weight_decays: the engine's parameter groups apply {groups}, the launch configured "
                   f"{expected['weight_decay']!r} (and 0 for the no-decay group)")
    if lr_engine is None or not math.isclose(lr_engine, lr_expected, rel_tol=1e-9, abs_tol=1e-15):
        out.append(f"lr: the engine's update applied {lr_engine!r}, the launch's schedule gives {lr_expected!r}")
    betas = [expected["adam_beta1"], expected["adam_beta2"]]
    if expected["config_betas"] != betas and not {"adam_beta1", "adam_beta2"} & set(expected["overridden"]):
        out.append(f"betas: verl's optim.betas={expected['config_betas']} do not reach Megatron, which runs {betas} "
                   "(verl's init_megatron_optim_config does not read them; override_optimizer_config.adam_beta1 and "
                   "adam_beta2 do)")
    return out


def planned_update(step: Path, part: dict, cache: dict | None = None) -> dict:
    """For the audited update ``step`` (``part``: a rank's record of it): the settings the reference's optimizer
    applies (``settings``) and the learning rate (``lr_expected``), from the run's launch where it left its
    overrides (``optimizer_source``: ``"launch"``), else the engine's own (``"engine"``: nothing to compare
    with); the engine's settings (``optimizer_engine``), the launch's (``optimizer_expected``) and their
    differences (``optimizer_failures``). ``cache``: composed configs by overrides, across steps."""
    engine = part["optimizer"]
    overrides = launch_overrides(step)
    if overrides is None:
        return {"settings": engine, "lr_expected": part["lr"], "optimizer_source": "engine",
                "optimizer_engine": engine, "optimizer_expected": None, "optimizer_failures": []}
    cache = {} if cache is None else cache
    key = tuple(overrides)
    if key not in cache:
        cache[key] = configured_optimizer(overrides)
    expected = cache[key]
    number = update_number(step)
    lr = scheduled_lr(expected, number)
    return {"settings": expected, "lr_expected": lr, "optimizer_source": "launch", "update_number": number,
            "optimizer_engine": engine, "optimizer_expected": expected,
            "optimizer_failures": optimizer_failures(expected, engine, lr, part["lr"])}


def near_ties(fp32: dict, *bf16: dict) -> dict:
    """How close to a tie each (token, layer) is whose forced routes are not the fp32 router's own choice, and how
    far the engine's router logits are from the fp32 router's.
    ``gap``: what the router's logits would have to move by for the forced experts to be its top-k, the largest
    logit among its own choices left out less the smallest among the forced experts it did not choose (> 0);
    ``shift``: how far bf16 rounding moved that token's router logits, the largest difference over the experts
    between a bf16 model's logits (the same inputs and routes: :func:`reference`'s bf16 passes, the largest over
    those given) and the fp32 model's. ``routes_tie_ratio_max`` is the largest gap / shift: a route that bf16
    rounding can flip has a ratio of a few (each of the two logits moved by about the shift); a route chosen by
    anything else (a biased router, another expert's index) is not a near-tie and has a large one.
    ``router_logit_offset_max`` (where the engine kept its router logits): per MoE layer and expert, the mean over the
    batch's tokens of the engine's logit less the fp32 router's, over the mean shift of those tokens; the largest.
    Rounding moves a token's logits both ways and averages out over the tokens; a per-expert bias moves one
    expert's logit the same way at every token. ``routes_within_rounding``: how many of all the (token, layer)
    routes have their own top-k within twice their shift of the next expert (the routes rounding of bf16's size can
    flip: how many near-ties the batch holds), of ``routes_compared``."""
    shifts = {key: torch.stack([(b["logits"][key] - l32).abs().max(-1).values for b in bf16]).max(0).values
              for key, l32 in fp32["logits"].items()}
    ratios = []
    for key, (tokens, forced) in fp32["differ"].items():
        l32, shift = fp32["logits"][key][tokens], shifts[key][tokens]
        own = l32.topk(forced.shape[-1], dim=-1).indices
        for t in range(len(tokens)):
            chosen, wanted = set(own[t].tolist()), set(forced[t].tolist())
            gap = max(float(l32[t, j]) for j in chosen - wanted) - min(float(l32[t, j]) for j in wanted - chosen)
            ratios.append(max(gap, 0.0) / max(float(shift[t]), 1e-12))
    within = compared = 0
    k = fp32.get("top_k")
    for key, l32 in fp32["logits"].items() if k is not None else ():
        if l32.shape[-1] > k:  # a router with more experts than it picks (else no route can flip)
            top = l32.topk(k + 1, dim=-1).values
            within += int((top[:, k - 1] - top[:, k] <= 2 * shifts[key]).sum())
            compared += l32.shape[0]
    out = {"routes_differing": len(ratios), "routes_tie_ratio_max": max(ratios, default=0.0),
           "routes_within_rounding": within, "routes_compared": compared}
    if "engine_logits" in fp32:
        moved, shifted = {}, {}  # per layer: the engine's logits less the fp32 router's, the tokens' shifts
        for (seq, layer), e in fp32["engine_logits"].items():
            moved.setdefault(layer, []).append(e - fp32["logits"][(seq, layer)])
            shifted.setdefault(layer, []).append(shifts[(seq, layer)])
        out["router_logit_offset_max"] = max(
            (float(torch.cat(moved[n]).mean(0).abs().max() / torch.cat(shifted[n]).mean().clamp(min=1e-12))
             for n in moved), default=0.0)
    return out


def rounding_routings(folder: Path) -> list[dict]:
    """The router logits of one audited update's bf16 passes as :func:`reference` runs them (the plain one and
    :data:`ROUNDING_DRAWS` draws) on the engine's own routes: :func:`near_ties`'s measure of rounding."""
    settings = run_settings(folder.parent)
    out = []
    for draw in (None, *range(ROUNDING_DRAWS)):
        out.append({})
        reference_step(folder, dtype=torch.bfloat16, settings=settings, routing=out[-1], rounding_draw=draw)
    return out


def route_bias_sweep(folder: Path, raises=(0.01, 0.02, 0.05, 0.1, 0.2), expert: int = 0,
                     where: str = "selection", rounding: list[dict] | None = None) -> list[dict]:
    """The routing checks on one audited update whose engine routes are those of a router with ``expert``'s logit
    raised by each of ``raises`` (:func:`reference_step`'s ``route_bias``, the mutation an engine router with a
    per-expert bias makes, at ``where``): per raise, the share of routes moved from the fp32 router's own, the engine
    routes that are no top-k of its logits and the near-tie figures (:func:`near_ties`, rounding measured by
    ``rounding``, else :func:`rounding_routings`)."""
    settings = run_settings(folder.parent)
    rounding = rounding or rounding_routings(folder)
    out = []
    for raise_by in raises:
        fp32 = {}
        r = reference_step(folder, settings=settings, routing=fp32, route_bias=(expert, raise_by, where))
        out.append({"step": folder.name, "raise": raise_by, "where": where,
                    "routes_moved": 1 - r["routes_native_agreement"],
                    "routes_not_engine_top_k": r["routes_not_engine_top_k"], **near_ties(fp32, *rounding)})
    return out


# the draws of bf16's rounding beside the unperturbed bf16 recomputation (reference()): four, each about 0.8 s an
# update of the tiny model on one core
ROUNDING_DRAWS = 4


def reference(root: str | Path, dtype: torch.dtype = torch.float32, settings: dict | None = None,
              rounding: bool = True) -> list[dict]:
    """Every audited step recomputed, and the optimizer step chained over them (:class:`ReferenceAdam`):
    the weights each update left compared with the reference's (:func:`weights_after`). The optimizer's
    settings and learning rate are those the run's launch configured (:func:`planned_update`); what the
    engine's optimizer held is beside them, and each difference is in ``optimizer_failures``.

    ``rounding``: each step recomputed a second time by the HF model in bf16 (the engine's dtype) on the same
    inputs and routes, its optimizer step chained beside the fp32 one: ``reference_bf16_grad_diff`` is the norm of
    the difference of the two gradients, how far bf16 rounding alone moves this update's gradient; and
    :data:`ROUNDING_DRAWS` times more in bf16 with the embeddings' output moved within one bf16 spacing
    (:func:`perturb_embeddings`): per part, the largest of the draws' differences from the fp32 gradient
    (``reference_bf16_part_grad_diff``; each draw's in ``reference_bf16_part_grad_diffs``), and of their log-probs'
    (``reference_bf16_logprob_rms_diff``). Mostly a few thousandths; at an update whose gradient flows through
    near-saturated attention into the first positions' embeddings it is the whole gradient (seen once: the fp32
    model's 2.35 against the bf16 model's 0.29), which is why the part bounds are taken from the same update."""
    from transformers import AutoModelForCausalLM

    out, adam, adam_bf16, composed = [], None, None, {}
    if settings is None:
        settings = run_settings(Path(root))
    for f in sorted(Path(root).glob("step-*")):
        if not any(f.glob("rank*.pt")):
            continue
        grads: dict = {}
        routing: dict = {}
        lp, lp16 = {}, {}
        r = reference_step(f, dtype=dtype, grads=grads, settings=settings, routing=routing, log_probs=lp)
        grads_bf16: dict | None = None
        if rounding:
            grads_bf16, routing_bf16 = {}, {}
            r16 = reference_step(f, dtype=torch.bfloat16, grads=grads_bf16, settings=settings,
                                 routing=routing_bf16, log_probs=lp16)
            r["reference_bf16_grad_norm"] = r16["reference_grad_norm"]
            r["reference_bf16_grad_diff"] = math.sqrt(sum(float(((g - grads_bf16[n]) ** 2).sum())
                                                          for n, g in grads.items()))
            # how far bf16 rounding moves each part's gradient and the log-probs at this update: the bf16 model's
            # forward and backward, and ROUNDING_DRAWS more with the embeddings' output moved within one bf16 spacing
            # (perturb_embeddings), each a draw of the rounding of the same computation. One draw is not a measure:
            # at the same update the draws' part differences spread 3 to 7 times (docs/BENCHMARKS.md, "The audit's
            # rounding draws"); the largest is the yardstick (audit_verdict.part_bound)
            diffs = [part_norms({n: g - grads_bf16[n] for n, g in grads.items()})]
            lp_diffs = [float((lp16["new"] - lp["new"]).pow(2).mean().sqrt())]
            routings = [routing_bf16]
            for draw in range(ROUNDING_DRAWS):
                g_draw, lp_draw, routings_draw = {}, {}, {}
                reference_step(f, dtype=torch.bfloat16, grads=g_draw, settings=settings, log_probs=lp_draw,
                               routing=routings_draw, rounding_draw=draw)
                diffs.append(part_norms({n: g - g_draw[n] for n, g in grads.items()}))
                lp_diffs.append(float((lp_draw["new"] - lp["new"]).pow(2).mean().sqrt()))
                routings.append(routings_draw)
            if r["forced_routes"]:
                r.update(near_ties(routing, *routings))
            r["reference_bf16_part_grad_diffs"] = diffs
            r["reference_bf16_part_grad_diff"] = {p: max(d[p] for d in diffs) for p in diffs[0]}
            r["reference_bf16_logprob_rms_diffs"] = lp_diffs
            r["reference_bf16_logprob_rms_diff"] = max(lp_diffs)
        if (f / "hf-after").is_dir():
            part = torch.load(next(iter(sorted(f.glob("rank*.pt")))), weights_only=False)
            planned = planned_update(f, part, composed)
            optimizer = planned.pop("settings")
            if adam is None:
                model = AutoModelForCausalLM.from_pretrained(str(f / "hf"), dtype=torch.float32)
                adam = ReferenceAdam(model, optimizer)
                adam_bf16 = ReferenceAdam(model, optimizer) if rounding else None
                del model
            if len(part.get("lrs", [part["lr"]])) != 1:
                raise ValueError(f"{f.name}: the update made {len(part['lrs'])} optimizer steps (several mini-batches "
                                 "or epochs); the reference chains one step per audited update")
            for chain, g in ((adam, grads), (adam_bf16, grads_bf16)):
                if chain is not None:
                    chain.configure(optimizer)
                    chain.step(g, planned["lr_expected"])
            r.update(lr=part["lr"], **planned, **weights_after(f, adam, adam_bf16))
        out.append(r)
    return out


def grad_parts(folder: Path) -> dict:
    """One audited step's reference gradient norm by part of the HF model (``embed``, ``layer<i>``, ``other``: the
    final norm and the head), from the fp32 and the bf16 model: where bf16 rounding moves the gradient."""
    import re

    settings = run_settings(folder.parent)
    out = {"step": folder.name}
    for dtype in (torch.float32, torch.bfloat16):
        grads: dict = {}
        r = reference_step(folder, dtype=dtype, grads=grads, settings=settings)
        parts: dict[str, float] = {}
        for name, g in grads.items():
            m = re.match(r"model\.layers\.(\d+)\.", name)
            key = f"layer{m.group(1)}" if m else ("embed" if "embed_tokens" in name else "other")
            parts[key] = parts.get(key, 0.0) + float((g ** 2).sum())
        out["engine_grad_norm"] = r["engine_grad_norm"]
        out[str(dtype).split(".")[-1]] = {"total": r["reference_grad_norm"],
                                          **{k: math.sqrt(v) for k, v in parts.items()}}
    return out


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m mcore_dapo_checks.audit_reference")
    ap.add_argument("audit_dir")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="the HF model's dtype")
    ap.add_argument("--route-bias", type=float, nargs="+", metavar="RAISE",
                    help="only the routing checks per step with the routes of a router whose expert 0 logit is raised "
                         "by each RAISE (the per-expert-bias mutation)")
    ap.add_argument("--grad-parts", action="store_true",
                    help="only each step's reference gradient norm by part (embeddings, each layer, the rest), in "
                         "fp32 and in bf16, beside the engine's norm")
    a = ap.parse_args(argv)
    steps = [f for f in sorted(Path(a.audit_dir).glob("step-*")) if any(f.glob("rank*.pt"))]
    if a.route_bias:
        print(json.dumps([r for f in steps for where in ("selection", "logits")
                          for r in route_bias_sweep(f, a.route_bias, where=where)]))
        return 0
    if a.grad_parts:
        print(json.dumps([grad_parts(f) for f in steps]))
        return 0
    out = reference(a.audit_dir, dtype=getattr(torch, a.dtype))
    print(json.dumps(out))
    return 1 if any(r.get("optimizer_failures") for r in out) else 0


if __name__ == "__main__":
    raise SystemExit(main())
