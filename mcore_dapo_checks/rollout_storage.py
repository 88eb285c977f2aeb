"""What a weight sync leaves inside vLLM's worker, recorded for the trainer tests.

``MCORE_DAPO_ROLLOUT_HOOK=mcore_dapo_checks.rollout_storage:record`` (set by :func:`rollout_env`, with the audit's
directory) is called by the plugin's storage guard (:mod:`mcore_dapo.patching.verl_any.rollout_storage_guard`) in
every vLLM worker: with each bucket the sync delivers, and after each sync. After a sync it appends one JSON line
per worker to ``<audit dir>/rollout_storage.jsonl``:

* ``addresses``: every parameter's storage address (the guard's map) before and after the sync, and those that
  moved; across consecutive syncs the "before" of one is compared with the "after" of the last (the engine's sleep,
  wake-up and generation in between);
* ``differ`` / ``unwritten``: each parameter's bytes against an independent load of what the sync delivered:
  vLLM's own ``load_weights`` of the received tensors into zero-filled stand-ins of the parameters (NaN-filled for
  floating point, so an element no tensor reached shows), then, for the stacked experts of vLLM's CPU MoE, vLLM's
  own packing (``cpu_prepack_moe_weight``);
* ``expert_slices``: under expert parallelism each local expert against the received tensors of the global expert
  vLLM's ``expert_map`` places there (gate, up and down projections of the HF names), so the EP slice is checked
  against the export itself and not only against vLLM's loader.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch

from mcore_dapo.patching.verl_any.rollout_storage_guard import HOOK_ENV, moved
from mcore_dapo.verl_plugin.registrations import AUDIT_ENV

LOG = "rollout_storage.jsonl"
_received: list[tuple[str, torch.Tensor]] = []
_last_after: dict[str, int] = {}


def rollout_env() -> dict:
    return {HOOK_ENV: f"{__name__}:record"}


def record(event: str, extension, **data) -> None:
    if event == "bucket":
        _received.extend((n, t.detach().clone()) for n, t in data["weights"])
        return
    model = extension.model_runner.model
    before, after = data["before"], data["after"]
    row = {"pid": os.getpid(), "rank": getattr(extension, "rank", None),
           "params": len(after), "moved_in_sync": moved(before, after),
           "moved_since_last": moved(_last_after, before) if _last_after else [],
           "received": len(_received)}
    row.update(compare(model, _received))
    _last_after.clear()
    _last_after.update(after)
    _received.clear()
    root = os.environ.get(AUDIT_ENV)
    if root:
        with open(Path(root) / LOG, "a") as f:
            f.write(json.dumps(row) + "\n")


def _fill(p: torch.Tensor) -> torch.Tensor:
    return torch.full_like(p, float("nan")) if p.is_floating_point() else torch.zeros_like(p)


def compare(model, received: list[tuple[str, torch.Tensor]]) -> dict:
    """The engine's parameters against vLLM's own load of ``received`` into stand-ins (see the module's text)."""
    params = dict(model.named_parameters())
    stand = {n: _fill(p) for n, p in params.items()}
    held = {n: p.data for n, p in params.items()}
    try:
        for n, p in params.items():
            p.data = stand[n]
        with torch.no_grad():
            model.load_weights(iter(received))
    finally:
        for n, p in params.items():
            p.data = held[n]
    packed = packed_form(model, {n: stand[n] for n in stand if _is_stacked(n)})
    differ, unwritten = [], {}
    for n, want in stand.items():
        want = packed.get(n, want)
        missing = int(torch.isnan(stand[n]).sum()) if stand[n].is_floating_point() else 0
        if missing:
            unwritten[n] = missing
        ok = ~torch.isnan(stand[n]) if stand[n].is_floating_point() else torch.ones_like(stand[n], dtype=torch.bool)
        if n in packed:  # packing moves elements: compare whole (every element must have been written)
            same = not missing and torch.equal(held[n], want)
        else:
            same = torch.equal(held[n][ok], want[ok])
        if not same:
            differ.append(n)
    return {"differ": differ, "unwritten": unwritten, "compared": len(stand),
            "expert_slices": _expert_slices(model, dict(received))}


def _is_stacked(name: str) -> bool:
    from mcore_dapo.bridge.models import stacked_expert_names

    return name.endswith(stacked_expert_names())


def packed_form(model, tensors: dict) -> dict:
    """Stacked expert weights as vLLM's CPU MoE holds them (its own ``cpu_prepack_moe_weight``); elsewhere as
    loaded."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or not tensors:
        return {}
    from vllm._custom_ops import cpu_prepack_moe_weight
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    modules = dict(model.named_modules())
    out = {}
    for name, t in tensors.items():
        kernel = modules[name.rsplit(".", 1)[0]].quant_method.moe_kernel
        experts = kernel.fused_experts if kernel is not None else None
        if isinstance(experts, CPUUnquantizedExperts) and not experts._use_zentorch:
            out[name] = cpu_prepack_moe_weight(t, experts.isa)
    return out


def _expert_slices(model, received: dict[str, torch.Tensor]) -> dict:
    """Under vLLM's expert parallelism: each local expert of each MoE layer against the received HF tensors of
    the global expert ``expert_map`` puts there (w13 = [gate; up], w2 = down; packed as the engine holds them)."""
    checked, bad, ep = 0, [], None
    for name, module in model.named_modules():
        manager = getattr(module, "expert_map_manager", None)
        if manager is None or not hasattr(module, "w13_weight"):
            continue
        ep = int(manager.ep_size)
        expert_map = module.expert_map
        if expert_map is None:
            continue
        layer = re.search(r"layers\.(\d+)\.", name)
        if layer is None:
            continue
        prefix = f"model.layers.{layer.group(1)}.mlp.experts"
        local = {int(i): g for g, i in enumerate(expert_map.tolist()) if i >= 0}
        w13 = torch.stack([torch.cat([received[f"{prefix}.{local[i]}.gate_proj.weight"],
                                      received[f"{prefix}.{local[i]}.up_proj.weight"]]) for i in sorted(local)])
        w2 = torch.stack([received[f"{prefix}.{local[i]}.down_proj.weight"] for i in sorted(local)])
        want = {f"{name}.w13_weight": w13.to(module.w13_weight.dtype), f"{name}.w2_weight": w2.to(module.w2_weight.dtype)}
        packed = packed_form(model, want)
        for key, t in want.items():
            held = getattr(module, key.rpartition(".")[2])
            checked += 1
            if not torch.equal(held.data, packed.get(key, t)):
                bad.append(key)
    return {"ep_size": ep, "checked": checked, "differ": bad}
