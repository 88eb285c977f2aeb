"""``mcore-dapo plan --show-config``: the Megatron settings the engine uses for a planned layout, on the plan's
device with that device's recipe stack (Transformer Engine on CUDA, MindSpeed on Ascend), without Megatron.

The fields are those :func:`mcore_dapo.bridge.megatron_config.transformer_config_kwargs` maps (as the verl engine
calls it: bf16, the alltoall dispatcher, no auxiliary loss, the plan's recompute), the layout's uneven first/last
stage sizes, and the device adapter's fast paths (``FastPaths.paths(recipe=True)``) under them; on
Ascend the MindSpeed flags its ``repatch`` is given.
"""

from __future__ import annotations

from mcore_dapo.bridge import HFModelConfig
from mcore_dapo.bridge.megatron_config import FIRST, LAST, transformer_config_kwargs
from mcore_dapo.plan.layouts import PlanLayout
from mcore_dapo.plan.workload import Workload

DISPATCHER = "alltoall"  # the engine's default (verl_plugin/engine.py)


def adapter_name(device_name: str) -> str:
    """The device adapter of a planner device (plan/hardware.py): ``npu`` for the Ascend parts, else ``cuda``."""
    return "npu" if device_name == "a2" else "cuda"


def recipe_stack(adapter) -> str:
    from mcore_dapo.devices.cuda import RECIPE_TE

    return {"cuda": f"Transformer Engine {RECIPE_TE}", "npu": "MindSpeed 26.1.0_core_r0.12.1"}.get(adapter.name, "")


def layout_settings(cfg: HFModelConfig, pl: PlanLayout, w: Workload) -> dict:
    """``{"device", "stack", "megatron": {TransformerConfig field: value}, ["mindspeed": {flag: value}],
    "fast_paths_off": {setting: reason}}`` for one planned layout."""
    from mcore_dapo.devices import get_adapter

    adapter = get_adapter(adapter_name(w.device.name))
    layout = pl.layout
    kw = transformer_config_kwargs(cfg, layout, dtype="bf16", dispatcher=DISPATCHER, aux_loss_coeff=0.0,
                                   recompute=w.recompute)
    if pl.first is not None:
        kw[FIRST] = pl.first
    if pl.last is not None and layout.pp != 2:
        kw[LAST] = pl.last
    paths = adapter.fast.paths(cfg, layout, dispatcher=DISPATCHER, recipe=True)
    kw.update({p.setting: p.value for p in paths if p.on and p.kind == "megatron"})
    out = {"device": adapter.name, "stack": recipe_stack(adapter), "megatron": dict(sorted(kw.items()))}
    flags = {p.setting: p.value for p in paths if p.on and p.kind != "megatron"}
    if flags:
        out["mindspeed"] = flags
    out["fast_paths_off"] = {p.setting: p.reason for p in paths if not p.on}
    return out


def render_settings(settings: dict, describe: str, width: int = 110) -> list[str]:
    import textwrap

    lines = [f"{describe} on {settings['device']} ({settings['stack']}):"]
    for key in ("megatron", "mindspeed"):
        if key in settings:
            text = " ".join(f"{k}={v}" for k, v in settings[key].items())
            lines += textwrap.wrap(text, width, initial_indent=f"  {key}: ", subsequent_indent=" " * (len(key) + 4))
    for setting, why in settings["fast_paths_off"].items():
        lines.append(f"  off: {setting}: {why}")
    return lines
