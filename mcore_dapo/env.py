"""What this machine has: device, package versions, the patches that apply."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import platform
import sys

PACKAGES = {
    "torch": ["torch"],
    "megatron-core": ["megatron-core", "megatron_core"],
    "transformers": ["transformers"],
    "verl": ["verl"],
    "mindspeed": ["mindspeed"],
    "mindspeed-rl": ["mindspeed-rl", "mindspeed_rl"],
    "torch_npu": ["torch-npu", "torch_npu"],
    "vllm": ["vllm"],
    "vllm-ascend": ["vllm-ascend", "vllm_ascend"],
    "transformer-engine": ["transformer-engine", "transformer_engine", "transformer-engine-torch"],
}


def _version(names: list[str]) -> str:
    for n in names:
        try:
            return md.version(n)
        except md.PackageNotFoundError:
            continue
    return "absent"


def nvidia_apex() -> str:
    """NVIDIA apex is detected by its fused norms; the registry's `apex` is an unrelated package."""
    if importlib.util.find_spec("apex") is None:
        return "absent"
    try:
        if importlib.util.find_spec("apex.normalization") is not None:
            return "present (NVIDIA)"
    except Exception:
        pass
    return "absent (an unrelated `apex` package is installed)"


def stack_report(adapter) -> tuple[list[dict], list[str]]:
    """The device recipe's stack against what is installed, and one line for each missing component."""
    stack = []
    for r in adapter.expected_stack():
        installed = r.installed()
        stack.append({"name": r.name, "accepted": list(r.accepted), "installed": installed or "absent",
                      "ok": r.ok(installed), "source": r.source, "install": r.install})
    missing = [f"{i['name']} {' or '.join(i['accepted'])} (installed: {i['installed']}): {i['install']}"
               for i in stack if not i["ok"]]
    return stack, missing


def supported(installed: dict) -> list[dict]:
    """torch, megatron-core and verl against the ranges this project supports (mcore_dapo.versions)."""
    from mcore_dapo import versions

    out = []
    for package in ("torch", "megatron-core", "verl"):
        v = installed[package]
        out.append({"package": package, "installed": v, "supported": versions.supported_range(package),
                    "ok": v != "absent" and versions.is_supported(package, v)})
    return out


def stack_pair(installed: dict) -> dict:
    """torch x megatron-core as a pair: the tested pair it belongs to, or why not (mcore_dapo.versions.PAIRS)."""
    from mcore_dapo import versions

    torch, mcore = installed["torch"], installed["megatron-core"]
    out = {"torch": torch, "megatron-core": mcore, "tested": [str(p) for p in versions.PAIRS]}
    if "absent" in (torch, mcore):
        return {**out, "ok": False, "why_not": "torch and megatron-core are not both installed"}
    pair = versions.supported_pair(torch, mcore)
    if pair is None:
        return {**out, "ok": False, "why_not": versions.unsupported_pair(torch, mcore)}
    return {**out, "ok": True, "pair": str(pair), "tested_by": pair.tested_by}


def fast_path_report(adapter) -> list[dict]:
    """Which fast paths run here (FastPaths.paths, for what this machine has installed) and, for each
    one that does not, why; decided for an MoE model under expert parallelism (Qwen3-30B-A3B's recipes: the
    MoE settings and MindSpeed's all-to-all overlap need both)."""
    from types import SimpleNamespace

    from mcore_dapo.bridge import Layout

    return [p.as_dict() for p in adapter.fast.paths(SimpleNamespace(is_moe=True), Layout(ep=8))]


def collect(device: str | None = None) -> dict:
    from mcore_dapo import __version__
    from mcore_dapo.devices import detect, get_adapter

    name = device or detect()
    adapter = get_adapter(name)
    versions = {k: _version(v) for k, v in PACKAGES.items()}
    versions["apex"] = nvidia_apex()
    patches = [
        {
            "id": st.id,
            "package": st.package,
            "versions": st.versions,
            "installed": st.installed or "absent",
            "applies": st.applies,
            **({"why_not": st.why_not} if st.why_not else {}),
        }
        for st in adapter.patch_status()
    ]
    stack, missing = stack_report(adapter)
    return {
        "supported": supported(versions),
        "stack_pair": stack_pair(versions),
        "mcore_dapo": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "device": name,
        "communication_backend": adapter.backend,
        "versions": versions,
        "patches": patches,
        "stack": stack,
        "missing": missing,
        "fast_paths": fast_path_report(adapter),
    }


def render(info: dict) -> str:
    lines = [
        f"mcore-dapo {info['mcore_dapo']}  python {info['python']}  {info['platform']}",
        f"device: {info['device']} (backend {info['communication_backend']})",
        "",
        "packages:",
    ]
    lines += [f"  {k:20s} {v}" for k, v in info["versions"].items()]
    lines += ["", "supported stack:"]
    lines += [f"  {s['package']:20s} {s['installed']:14s} {s['supported']:16s} "
              f"{'ok' if s['ok'] else 'NOT SUPPORTED'}" for s in info["supported"]]
    pair = info["stack_pair"]
    lines.append(f"  {'as a pair':20s} torch {pair['torch']} with megatron-core {pair['megatron-core']}: "
                 + (f"ok (tested: {pair['tested_by']})" if pair["ok"] else f"NOT SUPPORTED: {pair['why_not']}"))
    if info.get("fast_paths"):
        lines += ["", f"fast paths on {info['device']} here (an MoE model under expert parallelism):"]
        for p in info["fast_paths"]:
            state = "on " if p["on"] else "off"
            lines.append(f"  {state} {p['setting']:34s} {p['reason']}")
    lines += ["", f"patches for {info['device']}:"]
    if not info["patches"]:
        lines.append("  none")
    for p in info["patches"]:
        state = "applies" if p["applies"] else f"does not apply: {p['why_not']}"
        lines.append(f"  {p['id']:42s} {p['package']} {p['versions']:14s} {state}")
    if info.get("stack"):
        lines += ["", f"the {info['device']} recipe's stack (docs/ASCEND.md):"]
        for i in info["stack"]:
            state = "ok" if i["ok"] else "MISSING"
            lines.append(f"  {i['name']:20s} {' or '.join(i['accepted']):18s} installed {i['installed']:14s} {state}")
        if info["missing"]:
            lines += ["", f"missing for {info['device']} ({len(info['missing'])}):"]
            lines += [f"  {m}" for m in info["missing"]]
        else:
            lines += ["", f"nothing missing for {info['device']}"]
    return "\n".join(lines)
