#!/usr/bin/env python
"""How long one process takes to import Megatron's GPT and MoE modules on the CPU, with and without the CPU adapter's
prepare (which defers ``torch.compile`` while megatron.core imports, and wandb to its first use:
mcore_dapo/devices/cpu.py). Every torchrun rank,
verl worker and converter process pays this once; each measurement is a fresh interpreter.

    python tools/bench_megatron_import.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

CODE = """
import sys, time
t = time.perf_counter()
import torch
if {prepare}:
    from mcore_dapo.devices import get_adapter
    get_adapter("cpu").prepare()
import megatron.core.models.gpt, megatron.core.transformer.moe.moe_layer
print(time.perf_counter() - t, sum(m.startswith("torch._inductor") for m in sys.modules),
      sum(m.startswith("wandb.") for m in sys.modules))
"""


def measure(prepare: bool) -> tuple[float, int, int]:
    p = subprocess.run([sys.executable, "-c", CODE.format(prepare=prepare)], capture_output=True, text=True,
                       check=True)
    seconds, inductor, wandb = p.stdout.split()
    return float(seconds), int(inductor), int(wandb)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="fresh processes per variant, alternated (default 3)")
    a = ap.parse_args(argv)
    if a.repeat < 1:
        print(f"error: --repeat {a.repeat} is not accepted: a positive integer is", file=sys.stderr)
        return 2
    runs: dict[bool, list[tuple[float, int, int]]] = {False: [], True: []}
    for _ in range(a.repeat):
        for prepare in (False, True):
            runs[prepare].append(measure(prepare))
    for prepare, rs in runs.items():
        print(f"{'with' if prepare else 'without'} the CPU prepare: median {statistics.median(r[0] for r in rs):.2f} s "
              f"over {len(rs)} (modules imported: torch._inductor {rs[0][1]}, wandb {rs[0][2]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
