"""A torchrun worker for tests/test_launch_failures.py, without Megatron: rank ``--rank`` fails with
``--error``; the other ranks wait for it in a gloo barrier, so their own errors come after its. ``--error none``:
no rank fails; each reports how it was started (its environment, ``__main__``, random draws)."""

from __future__ import annotations

import argparse
import sys

USER_LINE = "--widget=7 is not accepted: accepted are 1 to 4"
TYPE_MESSAGE = "_write_item() missing 1 required positional argument: 'serialization_format'"


def parse_args(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--error", choices=["user", "type", "ray-user", "none"], required=True)
    ap.add_argument("--rank", type=int, default=1)
    ap.add_argument("--out", default=None)
    return ap.parse_args(argv)


def run(a) -> dict:
    import torch.distributed as dist

    from mcore_dapo.errors import UserError

    dist.init_process_group("gloo")
    if a.error == "none":
        import os
        import random

        import numpy
        import torch

        main = sys.modules["__main__"]
        mine = {"env": dict(os.environ), "argv0": sys.argv[0], "main_file": getattr(main, "__file__", None),
                "main_run": main.__dict__.get("run") is run, "main_names": sorted(main.__dict__),
                "random": random.random(), "numpy_random": float(numpy.random.random()),
                "torch_random": float(torch.rand(1)), "pid": os.getpid(),
                "own_session": os.getsid(0) == os.getpid()}
        ranks = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, mine)
        return {"ranks": ranks}
    if dist.get_rank() == a.rank:
        if a.error == "user":
            raise UserError(USER_LINE)
        if a.error == "ray-user":  # a UserError raised in a Ray actor, as Ray hands it to the caller
            import traceback

            from ray.exceptions import RayTaskError

            try:
                raise UserError(USER_LINE)
            except UserError as e:
                raise RayTaskError("Actor.method", "".join(traceback.format_exception(e)), e).as_instanceof_cause()
        raise TypeError(TYPE_MESSAGE)
    dist.barrier()
    return {"ok": True}


def main(argv=None) -> int:
    from mcore_dapo.runtime.launch import worker_main

    return worker_main(parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
