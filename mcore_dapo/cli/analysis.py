"""``mcore-dapo plan``, ``metrics`` and ``compare``: thin handlers over :mod:`mcore_dapo.plan` and
:mod:`mcore_dapo.metrics`. ``add_commands(sub)`` adds them to the main parser's subcommands."""

from __future__ import annotations

import json
import sys

from mcore_dapo.errors import UserError


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _plan(a) -> int:
    from mcore_dapo.bridge import load_hf_config
    from mcore_dapo.plan import Workload, get_device, plan
    from mcore_dapo.plan.planner import without_dominated_cp
    from mcore_dapo.plan.report import as_json, render

    if a.top < 1:
        raise UserError(f"--top {a.top} is not accepted: a positive number of rows is")
    from mcore_dapo.resources import model_path

    cfg = load_hf_config(model_path(a.model))
    w = Workload(
        get_device(a.device), nodes=a.nodes, devices_per_node=a.devices_per_node, max_prompt=a.max_prompt,
        max_response=a.max_response, micro_batch_tokens=a.micro_batch_tokens, prompts=a.prompts,
        responses_per_prompt=a.responses_per_prompt, gen_prompts=a.gen_prompts, mean_tokens=a.mean_tokens,
        recompute=a.recompute,
        offload=a.offload, gpu_memory_utilization=a.gpu_memory_utilization, efficiency=a.efficiency,
        step_overhead_ms=tuple(a.step_overhead_ms) if a.step_overhead_ms else None,
    )
    from mcore_dapo.plan.modes import GUIDE, phases_from_log

    phases = phases_from_log(a.phases) if a.phases else GUIDE  # a bad log is refused before the layouts
    ranked = plan(cfg, w, progress=None if a.json else _progress)
    shown = ranked if a.all else without_dominated_cp(ranked)
    modes = _modes(cfg, w, ranked, phases)
    from mcore_dapo.plan import generation as gen

    lengths = gen.lengths_of(w, phases)
    rollouts = gen.rank(cfg, w, lengths)
    if a.json:
        out = as_json(cfg, w, ranked, shown, a.top)
        top = rollouts[0] if rollouts and rollouts[0].fits else None
        out["rollout"] = {**(top.layout.keys() if top else dict.fromkeys(("gen_tp", "gen_dp", "gen_ep",
                                                                           "enforce_eager"))),
                          "generation_s": round(top.total_s, 2) if top else None,
                          "script_vars": top.layout.script_vars() if top else None,
                          "overrides": top.layout.overrides() if top else [],
                          "lengths": lengths.as_dict(), "constants": gen.constants(w),
                          "candidates": [g.as_dict() for g in rollouts[:a.top]]}
        if modes is not None:
            from mcore_dapo.plan.modes import cheaper

            out["modes"] = {m.mode: {**m.as_dict(), "cheaper": cheaper(m, w.device.fp8)} for m in modes[1]}
            out["modes_phases"] = modes[0].as_dict()
        if a.show_config:  # the Megatron settings of each listed layout (plan/settings.py)
            from mcore_dapo.plan.settings import layout_settings

            for row, c in zip(out["candidates"], shown[:a.top]):
                row.update(layout_settings(cfg, c.layout, w))
        print(json.dumps(out, indent=1))
    else:
        print(render(cfg, w, ranked, shown, a.top))
        print()
        print("\n".join(gen.render(rollouts, lengths, w, min(a.top, 5))))
        if modes is not None:
            from mcore_dapo.plan.modes import render as render_modes

            print()
            print("\n".join(render_modes(modes[1], modes[0], fp8=w.device.fp8)))
        if a.show_config:
            from mcore_dapo.plan.settings import layout_settings, render_settings

            for i, c in enumerate(shown[:a.top], 1):
                print()
                print("\n".join(render_settings(layout_settings(cfg, c.layout, w), f"#{i} {c.layout.describe()}")))
    return 0


def _modes(cfg, w, ranked, phases):
    """(phases, the trainer modes' projections, fastest first) from the best fitting layout that divides the
    batch; None when no layout fits."""
    from mcore_dapo.plan.modes import project

    samples = w.prompts * w.responses_per_prompt
    best = next((c for c in ranked if c.fits and samples % c.layout.layout.dp(w.world_size) == 0), None)
    if best is None:
        return None
    return phases, project(cfg, w, phases, best.time.total_s)


def _batch(a):
    from mcore_dapo.metrics import Batch

    return Batch(world_size=a.world_size, prompts=a.prompts, responses_per_prompt=a.responses_per_prompt)


def _metrics(a) -> int:
    from mcore_dapo.metrics import read_run, summarise, with_throughputs
    from mcore_dapo.metrics.report import render_steps, render_summary

    batch = _batch(a)
    runs = {log: read_run(log) for log in a.logs}
    ref = None
    if a.sync_reference:
        from mcore_dapo.metrics.offpolicy import reference_ms_per_token

        ref = reference_ms_per_token(read_run(a.sync_reference), a.warmup_steps)
    summaries = [summarise(r, batch, a.warmup_steps, ref) for r in runs.values()]
    steps = {name: with_throughputs(r, batch, ref) for name, r in runs.items()}
    if a.plot:
        from mcore_dapo.metrics.plot import plot_runs

        plot_runs(steps, a.plot)
    if a.json:
        print(json.dumps({"runs": [{**s, "per_step": steps[s["source"]]} for s in summaries],
                          "sync_reference_ms_per_token": ref, "plot": a.plot}, indent=1))
        return 0
    for s in summaries:
        print(render_steps(steps[s["source"]]))
        print(render_summary(s))
        print()
    if a.plot:
        print(f"plot written to {a.plot}")
    return 0


def _compare(a) -> int:
    from mcore_dapo.metrics import read_run, summarise
    from mcore_dapo.metrics.compare import compare, render

    batch = _batch(a)
    sa, sb = (summarise(read_run(p), batch, a.warmup_steps) for p in (a.a, a.b))
    rows = compare(sa["median"], sb["median"])
    if a.json:
        print(json.dumps({"a": a.a, "b": a.b, "ratio": "B / A", "rows": rows}, indent=1))
    else:
        print(render(rows, a.a, a.b))
    return 0


def _throughput_args(p) -> None:
    p.add_argument("--world-size", type=int, default=None, help="devices of the run (default: from perf/throughput)")
    p.add_argument("--prompts", type=int, default=None, help="data.train_batch_size, for the guide's formula")
    p.add_argument("--responses-per-prompt", type=int, default=None, help="actor_rollout_ref.rollout.n")
    p.add_argument("--warmup-steps", type=int, default=1, help="steps numbered up to this are left out of medians")
    p.add_argument("--json", action="store_true")


def add_commands(sub) -> None:
    """Add ``plan``, ``metrics`` and ``compare`` to an argparse subparsers object."""
    p = sub.add_parser("plan", help="rank the TP/PP/EP/ETP/CP/VPP layouts that fit, with verl overrides")
    p.add_argument("--model", required=True, help="Hugging Face model folder or its config.json, or "
                   "qwen3-30b-a3b (the shipped config)")
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--devices-per-node", type=int, required=True)
    p.add_argument("--device", required=True, help="h100, h200, a100, a2")
    p.add_argument("--max-prompt", type=int, default=2048)
    p.add_argument("--max-response", type=int, default=6144)
    p.add_argument("--micro-batch-tokens", type=int, default=16384, help="verl's ppo_max_token_len_per_gpu")
    p.add_argument("--prompts", type=int, default=32, help="data.train_batch_size")
    p.add_argument("--responses-per-prompt", type=int, default=16, help="actor_rollout_ref.rollout.n")
    p.add_argument("--gen-prompts", type=int, default=96,
                   help="prompts generated per step, data.gen_batch_size (the guide's 3 x train_batch_size)")
    p.add_argument("--mean-tokens", type=int, default=None, help="mean sample length (default: the maxima)")
    p.add_argument("--recompute", default="full", help="full, selective or none")
    p.add_argument("--offload", default="none", help="none, optimizer, param or param+optimizer")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5, help="vLLM's share during rollout")
    p.add_argument("--efficiency", type=float, default=0.25, help="achieved fraction of the peak bf16 rate")
    p.add_argument("--step-overhead-ms", type=float, nargs=2, default=None, metavar=("EAGER", "GRAPH"),
                   help="the rollout's per-decode-step overhead beyond the bytes read, eager and graph mode, measured "
                        "on the device (docs/PLANNER.md; default: the planner's guess)")
    p.add_argument("--phases", default=None, metavar="LOG",
                   help="a synchronous run's verl console log whose phase times the trainer modes are projected from "
                        "(default: the guide's logged step)")
    p.add_argument("--top", type=int, default=10)
    p.add_argument("--all", action="store_true", help="also list CP variants that need no less memory and are slower")
    p.add_argument("--json", action="store_true")
    p.add_argument("--show-config", action="store_true",
                   help="for each listed layout, the Megatron settings the engine uses on the device with its recipe's "
                        "stack (Transformer Engine on CUDA, MindSpeed on Ascend); JSON keys megatron, mindspeed")
    p.set_defaults(fn=_plan)

    p = sub.add_parser("metrics", help="throughputs and summaries of verl console logs, with plots")
    p.add_argument("logs", nargs="+", metavar="LOG", help="log file or Ray session log folder (one run each)")
    p.add_argument("--plot", default=None, metavar="OUT.png")
    p.add_argument("--sync-reference", default=None, metavar="SYNC.log",
                   help="a synchronous run on the same cluster: gen_hidden, the share of its generation time per "
                        "response token that an asynchronous run no longer waits for")
    _throughput_args(p)
    p.set_defaults(fn=_metrics)

    p = sub.add_parser("compare", help="ratio table B / A of two runs, with which way is better")
    p.add_argument("a", metavar="A.log")
    p.add_argument("b", metavar="B.log")
    _throughput_args(p)
    p.set_defaults(fn=_compare)


def main(argv=None) -> int:
    """``python -m mcore_dapo.cli.analysis plan|metrics|compare ...`` (the same as ``mcore-dapo ...``)."""
    import argparse

    from mcore_dapo.cli import user_errors

    ap = argparse.ArgumentParser(prog="mcore-dapo")
    add_commands(ap.add_subparsers(dest="cmd", required=True))

    @user_errors
    def run(args) -> int:
        a = ap.parse_args(args)
        return a.fn(a)

    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
