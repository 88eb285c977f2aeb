"""Text and JSON of a plan: the ranked table, and the verl overrides of the best fitting layout."""

from __future__ import annotations

from mcore_dapo.bridge import HFModelConfig
from mcore_dapo.plan.memory import GIB, LOGIT_BYTES, MOE_IMBALANCE, OVERHEAD_GIB, replay_bytes
from mcore_dapo.plan.params import model_params
from mcore_dapo.plan.planner import Candidate, verl_overrides
from mcore_dapo.plan.timing import LINK_EFFICIENCY
from mcore_dapo.plan.workload import Workload

ASSUMPTIONS = (
    f"compute at {{eff:.0%}} of peak; communication not overlapped, links at {LINK_EFFICIENCY:.0%}; "
    f"routed tokens x{MOE_IMBALANCE} for imbalance; logits {LOGIT_BYTES} B/token/vocab; "
    f"{OVERHEAD_GIB:g} GiB runtime overhead; generation modelled apart (plan/generation.py)"
)


def header(cfg: HFModelConfig, w: Workload, candidates: list[Candidate], shown: int) -> str:
    total, active = model_params(cfg)
    d = w.device
    fitting = sum(c.fits for c in candidates)
    return "\n".join([
        f"model: {cfg.model_type}, {cfg.num_layers} layers, {cfg.num_experts} experts top-{cfg.num_experts_per_tok}, "
        f"{total / 1e9:.2f}B parameters ({active / 1e9:.2f}B active without the embedding)",
        f"cluster: {w.nodes} x {w.devices_per_node} {d.name} ({d.bf16_tflops:g} TFLOPS bf16, {d.hbm_gib:g} GiB, "
        f"{d.intra_link}; {d.inter_link})",
        f"workload: {w.prompts} prompts x {w.responses_per_prompt} responses x {w.sample_tokens} tokens, "
        f"{w.micro_batch_tokens} tokens per micro-batch, recompute {w.recompute}, offload {w.offload}, "
        f"vLLM share {w.gpu_memory_utilization}",
        "assumptions: " + ASSUMPTIONS.format(eff=w.efficiency),
        *([f"router replay data (tokens x MoE layers x top-k x 4 B): {replay_bytes(cfg, w.micro_batch_tokens) / 2**20:.1f} "
           f"MiB per micro-batch on the device (in the update figures), "
           f"{replay_bytes(cfg, w.step_tokens) / GIB:.2f} GiB for the step's whole batch"] if cfg.is_moe else []),
        f"{len(candidates)} legal layouts, {fitting} fit in memory"
        + (f"; {len(candidates) - shown} CP variants that gain nothing left out (--all lists them)"
           if shown < len(candidates) else ""),
    ])


def table(candidates: list[Candidate], w: Workload, top: int) -> str:
    cols = f"{'#':>3s}  {'layout':44s} {'DP':>4s} {'EDP':>4s} {'mb':>4s} {'update GiB':>10s} {'rollout GiB':>11s} " \
           f"{'compute s':>9s} {'comm s':>7s} {'bubble s':>8s} {'step s':>7s}  fits"
    rows = [cols]
    for i, c in enumerate(candidates[:top], 1):
        lay, t = c.layout.layout, c.time
        upd = max(s.update_total for s in c.memory)
        rol = max(s.rollout_total for s in c.memory)
        rows.append(
            f"{i:3d}  {c.layout.describe():44s} {lay.dp(w.world_size):4d} {lay.expert_dp(w.world_size):4d} "
            f"{t.micro_batches:4d} {upd:10.1f} {rol:11.1f} {t.compute_s:9.1f} {t.comm_s:7.1f} {t.bubble_s:8.1f} "
            f"{t.total_s:7.1f}  {'yes' if c.fits else 'NO'}"
        )
    return "\n".join(rows)


def render(cfg: HFModelConfig, w: Workload, ranked: list[Candidate], shown: list[Candidate], top: int) -> str:
    """``ranked``: every layout, best first; ``shown``: those to list (a subset, same order)."""
    out = [header(cfg, w, ranked, len(shown)), "", table(shown, w, top), ""]
    best = next((c for c in shown if c.fits), None)
    if best is None:
        low = min(ranked, key=lambda c: c.peak_gib)
        out.append(f"no layout fits {w.device.hbm_gib:g} GiB; the smallest peak is {low.peak_gib:.1f} GiB "
                   f"({low.layout.describe()}): offload more, lower the vLLM share or the micro-batch tokens")
        return "\n".join(out)
    out.append(f"verl overrides for the best layout ({best.layout.describe()}):")
    ov = verl_overrides(best, w)
    out += [f"  {o} \\" for o in ov[:-1]] + [f"  {ov[-1]}"]
    return "\n".join(out)


def as_json(cfg: HFModelConfig, w: Workload, ranked: list[Candidate], shown: list[Candidate], top: int) -> dict:
    total, active = model_params(cfg)
    best = next((c for c in shown if c.fits), None)
    return {
        "model": {"model_type": cfg.model_type, "params": total, "active_params": active},
        "device": w.device.as_dict(),
        "workload": w.as_dict(),
        "assumptions": ASSUMPTIONS.format(eff=w.efficiency),
        "legal_layouts": len(ranked),
        "fitting_layouts": sum(c.fits for c in ranked),
        "listed_layouts": len(shown),
        "candidates": [{**c.as_dict(w.world_size), "overrides": verl_overrides(c, w)} for c in shown[:top]],
        "best": best.layout.describe() if best else None,
    }
