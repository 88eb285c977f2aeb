"""Ratio table of two runs (the guide's section 4.2 kind): B / A for each metric, and which way is better."""

from __future__ import annotations

LOWER, HIGHER, NEUTRAL = "lower is better", "higher is better", "neither (workload, not speed)"

ROWS = (
    # (label, key, direction)
    ("end-to-end time", "timing_s/step", LOWER),
    ("generation time", "timing_s/gen", LOWER),
    ("old log-prob time", "timing_s/old_log_prob", LOWER),
    ("update time", "timing_s/update_actor", LOWER),
    ("end-to-end throughput", "e2e_tps", HIGHER),
    ("training throughput", "update_tps", HIGHER),
    ("inference throughput", "vllm_tps", HIGHER),
    ("reward mean", "critic/rewards/mean", HIGHER),
    ("peak memory allocated", "perf/max_memory_allocated_gb", LOWER),
    ("response length mean", "response_length/mean", NEUTRAL),
)


def verdict(ratio: float, direction: str, tolerance: float = 0.02) -> str:
    if direction == NEUTRAL:
        return "-"
    if abs(ratio - 1.0) <= tolerance:
        return "same"
    b_better = ratio < 1.0 if direction == LOWER else ratio > 1.0
    return "B better" if b_better else "A better"


def compare(a: dict, b: dict) -> list[dict]:
    """Rows for the medians ``a`` and ``b`` (from :func:`summarise`); metrics missing from either are left out."""
    rows = []
    for label, key, direction in ROWS:
        va, vb = a.get(key), b.get(key)
        if va is None or vb is None:
            continue
        ratio = vb / va if va else float("inf")
        if key == "critic/rewards/mean" and (va <= 0 or vb <= 0):
            ratio_text = "n/a (sign)"  # a ratio of rewards that may be negative says nothing
            rows.append(dict(label=label, key=key, a=va, b=vb, ratio=None, ratio_text=ratio_text,
                             direction=direction, verdict="B better" if vb > va else "A better" if vb < va else "same"))
            continue
        rows.append(dict(label=label, key=key, a=va, b=vb, ratio=ratio, ratio_text=f"{ratio:.2f}",
                         direction=direction, verdict=verdict(ratio, direction)))
    return rows


def render(rows: list[dict], name_a: str, name_b: str) -> str:
    head = f"A = {name_a}\nB = {name_b}\nratio = B / A\n"
    w = max(len(r["label"]) + len(r["key"]) + 3 for r in rows) if rows else 20
    lines = [f"{'metric':{w}s}  {'A':>12s}  {'B':>12s}  {'B/A':>10s}  {'direction':30s}  verdict"]
    for r in rows:
        name = f"{r['label']} ({r['key']})"
        lines.append(f"{name:{w}s}  {r['a']:12.4g}  {r['b']:12.4g}  {r['ratio_text']:>10s}  {r['direction']:30s}  "
                     f"{r['verdict']}")
    return head + "\n".join(lines)
