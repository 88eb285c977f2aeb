"""Router replay (R2, R3) and the routing-agreement metric of :class:`McoreDapoEngine`.

verl 0.9.1 switches replay on in its own ``_build_tf_config``, which the plugin's engine replaces: the engine sets the
flag itself (:func:`config_fields`); verl's patch and its R2/R3 actions stay verl's. verl's route helpers place routes
in the packed (THD) order only; with padded batches (``use_remove_padding=False``, the CPU's) :func:`bshd_forward_step`
records and sets them in the ``[seq, batch]`` order Megatron's router sees. Routes are per token ``[layers, top_k]``
expert indices (verl's format). The routing agreement is measured from the routing maps the routers returned
(:class:`RouteProbe`, which keeps their logits too), not from replay state. verl's side: docs/VERL_PLUGIN.md,
"Router replay (R2, R3) and the routing-agreement metric".
"""

from __future__ import annotations

import torch

from mcore_dapo.errors import UserError

ROLLOUT_KEY = "rollout_routed_experts"  # rollout routes kept for the metric when verl must not replay them
AGREEMENT = "routing/rollout_agreement"  # old-log-prob forward vs the rollout's routes
REPLAYED = "routing/replay_agreement"  # update forward vs the routes in the batch (R2: recorded, R3: rollout)


def mode(engine) -> str:
    return str(engine.engine_config.router_replay.mode)


def config_fields(cfg, replay: str) -> dict:
    """TransformerConfig fields for ``router_replay.mode``; a model without MoE layers is refused."""
    if replay == "disabled":
        return {}
    if not cfg.is_moe:
        raise UserError(f"router_replay.mode={replay} needs a model with MoE layers; this one has none "
                        f"(num_layers={cfg.num_layers}, num_experts=0); accepted with it is router_replay.mode=disabled")
    from mcore_dapo import megatron_compat

    if not megatron_compat.supports_routing_replay():
        from importlib.metadata import version

        raise UserError(megatron_compat.routing_replay_refusal(replay, version("megatron-core")))
    return {"moe_enable_routing_replay": True}


def model_routers(model) -> list:
    """``(layer_number, TopKRouter)`` of the decoder of one model chunk (or a list), by layer."""
    from megatron.core.transformer.moe.router import TopKRouter

    from mcore_dapo.resharding.export import unwrap

    found = []
    for chunk in model if isinstance(model, (list, tuple)) else [model]:
        chunk = unwrap(chunk)
        for m in getattr(chunk, "decoder", chunk).modules():
            if isinstance(m, TopKRouter) and m.layer_number is not None:
                found.append((m.layer_number, m))
    return sorted(found, key=lambda x: x[0])


def route_layer_index(tf, layers_in_routes: int, layer_number: int) -> int:
    """Index into the routes' layer axis: every layer, or the MoE layers only."""
    layer = layer_number - 1
    if layers_in_routes == tf.num_layers:
        return layer
    freq = tf.moe_layer_freq
    moe = [(i % freq == 0) if isinstance(freq, int) else bool(freq[i]) for i in range(tf.num_layers)]
    return sum(moe[:layer])


def num_moe_layers(tf) -> int:
    freq = tf.moe_layer_freq
    return sum((i % freq == 0) if isinstance(freq, int) else bool(freq[i]) for i in range(tf.num_layers))


def check_routes(replay: str, routes, input_ids, tf) -> None:
    """One line naming the mode and the shapes when routes do not fit the batch."""
    lens = input_ids.offsets().diff().tolist()
    if not getattr(routes, "is_nested", False):
        raise UserError(f"router_replay.mode={replay}: routed_experts must be nested per sample "
                        f"[tokens, layers, top_k], got a dense tensor of shape {tuple(routes.shape)}")
    parts = routes.unbind()
    layer_counts = {tf.num_layers, num_moe_layers(tf)}
    bad = None
    if len(parts) != len(lens):
        bad = f"{len(parts)} samples for {len(lens)} in the batch"
    else:
        for i, (p, n) in enumerate(zip(parts, lens)):
            if p.dim() != 3 or p.shape[0] not in (n, n - 1) or p.shape[1] not in layer_counts \
                    or p.shape[2] != tf.moe_router_topk:
                bad = f"sample {i}: {tuple(p.shape)} for {n} tokens"
                break
    if bad:
        raise UserError(f"router_replay.mode={replay}: routed_experts do not match the batch ({bad}); accepted per "
                        f"sample is [tokens or tokens-1, {' or '.join(map(str, sorted(layer_counts)))} layers, "
                        f"top_k={tf.moe_router_topk}]")


class TokenOrder:
    """Where each token of a padded (BSHD) micro-batch sits in this rank's router input."""

    def __init__(self, input_ids, forced_max_seqlen=None):
        from megatron.core import parallel_state as mpu
        from verl.models.mcore.util import preprocess_bshd_engine

        self.lens = input_ids.offsets().diff().tolist()
        self.forced = forced_max_seqlen
        _, mask, _ = preprocess_bshd_engine(input_ids, pre_process=True, forced_max_seqlen=forced_max_seqlen)
        self.mask = mask.bool().cpu()  # [b, s_pad]
        self.b, self.s = self.mask.shape
        self.tp = mpu.get_tensor_model_parallel_world_size()
        self.tp_rank = mpu.get_tensor_model_parallel_rank()

    def padded(self, nested) -> torch.Tensor:
        """Nested ``[b, j, ...]`` -> ``[b, s_pad, ...]`` (zeros after each sample)."""
        out = torch.zeros((self.b, self.s, *nested.shape[2:]), dtype=nested.dtype)
        for i, t in enumerate(nested.unbind()):
            out[i, : t.shape[0]] = t.cpu()
        return out

    def local(self, x: torch.Tensor, sp: bool) -> torch.Tensor:
        """``[b, s_pad, ...]`` -> this rank's router rows ``[s_local * b, ...]`` (``[seq, batch]`` order)."""
        x = x.transpose(0, 1)
        if sp and self.tp > 1:
            n = self.s // self.tp
            x = x[self.tp_rank * n:(self.tp_rank + 1) * n]
        return x.reshape(-1, *x.shape[2:])

    def unlocal(self, rows: torch.Tensor, sp: bool):
        """This rank's router rows -> nested per sample ``[j, ...]`` (gathered over the TP group under SP)."""
        if sp and self.tp > 1:
            import torch.distributed as dist
            from megatron.core import parallel_state as mpu

            parts = [torch.empty_like(rows) for _ in range(self.tp)]
            dist.all_gather(parts, rows.contiguous(), group=mpu.get_tensor_model_parallel_group())
            rows = torch.cat(parts)
        full = rows.reshape(self.s, self.b, *rows.shape[1:]).transpose(0, 1)
        return torch.nested.as_nested_tensor([full[i, :n] for i, n in enumerate(self.lens)], layout=torch.jagged)


def replay_rows(order: TokenOrder, routes, replay: str) -> torch.Tensor:
    """Which padded positions replay (``[b, s_pad]``): the real tokens; under R3 not the last one of a
    sample (the rollout never routed it: it was not fed back), as verl's ``build_r3_replay_mask``."""
    keep = order.mask.clone()
    if replay == "R3":
        for i, n in enumerate(order.lens):
            keep[i, n - 1:] = False
    return keep


class RouteProbe:
    """Forward hooks on the routers: for each micro-batch whose expected routes are set, counts the
    (token, layer) pairs whose top-k set equals the expected one, from the routing map the router
    returned. While :meth:`keep` is on, each micro-batch's routes as the routers returned them in its forward
    (not in a recomputation during the backward) are kept, with the logits the routers chose them from (their
    ``gating``'s output), and :meth:`kept_routes` gives both per sample."""

    def __init__(self, chunks, tf):
        self.tf = tf
        self.routers = model_routers(chunks)
        self.expected = None
        self.equal = 0
        self.total = 0
        self.kept: list[dict] | None = None  # per micro-batch forward: its TokenOrder, input ids and routing maps
        self._live: dict | None = None
        for number, router in self.routers:
            router.register_forward_hook(self._hook(number))
            router.gating = self._keeping_logits(number, router.gating)

    def _keeping_logits(self, number, gating):
        def keeping(*args, **kwargs):
            logits = gating(*args, **kwargs)
            if self._live is not None:
                self._live["logits"][number] = logits.detach().float().reshape(-1, logits.shape[-1]).cpu()
            return logits
        return keeping

    def expect(self, rows: torch.Tensor | None, count: torch.Tensor | None) -> None:
        """``rows``: this rank's expected routes ``[tokens_local, layers, top_k]``; ``count``: which rows count."""
        self.expected = None if rows is None else (rows, count)

    def keep(self, on: bool) -> None:
        """Keep the routes of every micro-batch forward from now on (``on``), or stop and drop them."""
        self.kept = [] if on else None
        self._live = None

    def forward_begins(self, order: TokenOrder, input_ids) -> None:
        if self.kept is not None:
            self._live = {"order": order, "ids": [tuple(t.tolist()) for t in input_ids.unbind()], "maps": {},
                          "logits": {}}
            self.kept.append(self._live)

    def forward_ends(self) -> None:
        self.expected = None
        self._live = None

    def _hook(self, number):
        def hook(module, args, output):
            if self._live is None and self.expected is None:
                return
            routing_map = output[1].detach().cpu()  # one host copy for both uses
            if self._live is not None:
                self._live["maps"][number] = routing_map
            if self.expected is None:
                return
            rows, count = self.expected
            idx = route_layer_index(self.tf, rows.shape[1], number)
            want = torch.zeros(routing_map.shape, dtype=torch.bool)
            want.scatter_(1, rows[:, idx].long(), True)  # novermin: Tensor.long
            same = (routing_map == want).all(-1) & count
            self.equal += int(same.sum())
            self.total += int(count.sum())
        return hook

    def take(self) -> tuple[int, int]:
        out = (self.equal, self.total)
        self.equal = self.total = 0
        return out

    def kept_routes(self) -> dict[tuple, dict[int, tuple[torch.Tensor, torch.Tensor | None]]]:
        """The kept routes by sample (its token ids) and layer number: ``[tokens, top_k]`` expert indices, in
        ascending order, of the layers this rank holds, each with the router's logits ``[tokens, experts]`` (float32;
        None where the router's logits had other rows than its routing map). Collective over the tensor-parallel
        group under sequence parallelism (each rank routes its share of the sequence)."""
        sp, k = bool(self.tf.sequence_parallel), int(self.tf.moe_router_topk)
        out: dict[tuple, dict[int, tuple]] = {}
        for entry in self.kept or ():
            for number, routing_map in sorted(entry["maps"].items()):
                if bool((routing_map.sum(-1) != k).any()):  # token dropping (a capacity factor) routes fewer
                    raise RuntimeError(f"layer {number}: a token not routed to top_k={k} experts; routes are kept "
                                       "without token dropping only")
                rows = torch.sort(routing_map.to(torch.int8).topk(k, dim=-1).indices, dim=-1).values
                routes = entry["order"].unlocal(rows.to(torch.int32), sp).unbind()
                logits = entry["logits"].get(number)
                logits = [None] * len(routes) if logits is None or logits.shape != routing_map.shape else \
                    entry["order"].unlocal(logits, sp).unbind()
                for ids, r, lg in zip(entry["ids"], routes, logits):
                    out.setdefault(ids, {})[number] = (r, lg)
        return out


def agreement(equal: int, total: int) -> float | None:
    """Sum over all ranks; rows of a tensor-parallel group without sequence parallelism are counted
    once per rank, so the fraction is right either way."""
    import torch.distributed as dist

    t = torch.tensor([float(equal), float(total)], dtype=torch.float64)
    dist.all_reduce(t)
    return None if t[1] == 0 else float(t[0] / t[1])


def forward_backward_batch(engine, base, data, loss_function, forward_only):
    """verl's ``forward_backward_batch`` with the checks of the replay data and the agreement probe.

    R2 and disabled keep rollout routes (``routed_experts`` from a rollout that returns them) away
    from verl, which would otherwise replay them in R2's recording pass, and measure against them."""
    from verl.utils import tensordict_utils as tu

    replay = mode(engine)
    active = replay != "disabled" and tu.get_non_tensor_data(data, "enable_routing_replay", default=False)
    routes = data.get("routed_experts", None)
    if forward_only and routes is not None and replay != "R3":
        data[ROLLOUT_KEY] = data.pop("routed_experts")
    if active and replay == "R3" and routes is None:
        raise UserError("router_replay.mode=R3 needs the rollout's routed experts in the batch (routed_experts, "
                        "[tokens, layers, top_k] per sample), and the batch has none: set "
                        "actor_rollout_ref.rollout.enable_rollout_routing_replay=True")
    if active and not forward_only and routes is None:
        raise UserError(f"router_replay.mode={replay}: the update batch has no routed_experts to replay "
                        "(R2 records them in compute_log_prob; R3 takes them from the rollout)")
    if routes is not None:
        check_routes(replay, routes, data["input_ids"], engine.tf_config)
    probe = getattr(engine, "_mcore_route_probe", None)
    out = base(data, loss_function, forward_only)
    if probe is not None:
        fraction = agreement(*probe.take())
        if fraction is not None:
            engine._mcore_routing_metrics[AGREEMENT if forward_only else REPLAYED] = fraction
    return out


def bshd_forward_step(engine, base, batch_iter, model, logits_processor_func, postprocess_micro_batch_func):
    """verl's ``forward_step`` for padded batches, with routes recorded and set in the router's
    token order (verl's own route handling, THD-only, is kept out of this micro-batch)."""
    from verl.utils import tensordict_utils as tu
    from verl.utils.megatron.router_replay_patch import RouterReplayAction as A

    batch = next(batch_iter)
    tf = engine.tf_config
    sp = bool(tf.sequence_parallel)
    order = TokenOrder(batch["input_ids"], tu.get_non_tensor_data(batch, "forced_max_seqlen", default=None))
    routers = [(n, r.router_replay) for n, r in model_routers(model) if getattr(r, "router_replay", None)]
    action = routers[0][1].router_replay_action if routers else None
    if action == A.REPLAY_BACKWARD:  # the previous micro-batch's backward is done
        for _, rr in routers:
            rr.set_router_replay_action(A.REPLAY_FORWARD)
        action = A.REPLAY_FORWARD
    replay = mode(engine)
    if action == A.REPLAY_FORWARD:
        routes = batch.get("routed_experts", None)
        if routes is None:
            raise UserError(f"router_replay.mode={replay}: a micro-batch has no routed_experts to replay")
        padded = order.padded(routes)
        rows = order.local(padded, sp)
        keep = order.local(replay_rows(order, routes, replay), sp)
        for number, rr in routers:
            rr.set_target_indices(rows[:, route_layer_index(tf, rows.shape[1], number)].long(), replay_mask=keep)  # novermin
    probe = getattr(engine, "_mcore_route_probe", None)
    if probe is not None:
        probe.forward_begins(order, batch["input_ids"])
        # replaying: against the replayed routes; else against the rollout's, where kept for the metric
        expected = batch.get("routed_experts", None) if action == A.REPLAY_FORWARD else batch.get(ROLLOUT_KEY, None)
        if expected is None:
            probe.expect(None, None)
        else:
            # rows that count: those replayed; for the rollout's routes, all but each sample's last token
            rule = replay if action == A.REPLAY_FORWARD else "R3"
            probe.expect(order.local(order.padded(expected), sp), order.local(replay_rows(order, expected, rule), sp))
    record = tu.get_non_tensor_data(batch, "record_r2_routes", default=False)
    tu.assign_non_tensor(batch, record_r2_routes=False)
    engine.enable_routing_replay = False  # verl's THD route placement stays out of this micro-batch
    try:
        out = base(iter([batch]), model, logits_processor_func, postprocess_micro_batch_func)
    finally:
        engine.enable_routing_replay = replay != "disabled"
        tu.assign_non_tensor(batch, record_r2_routes=record)
        if probe is not None:
            probe.forward_ends()
    if record:
        missing = [n for n, rr in routers if rr.recorded_topk_idx is None]
        if not routers or missing:
            raise RuntimeError(f"R2 recording found no routes for layers {missing or 'all'}")
        rows = torch.stack([rr.recorded_topk_idx.cpu() for _, rr in routers], dim=1).to(torch.int32)
        nested = order.unlocal(rows, sp)
        engine.mini_layer_topk_idx_list.append(
            torch.nested.as_nested_tensor([t.to(torch.int16) for t in nested.unbind()], layout=torch.jagged))
    if action == A.REPLAY_FORWARD:
        for _, rr in routers:
            rr.set_router_replay_action(A.REPLAY_BACKWARD)
    return out
