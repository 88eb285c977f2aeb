"""The product's forward check (:mod:`mcore_dapo.convert.forward_check`) with Megatron broken on purpose, to show
what the comparison catches. Run under torchrun as that module (same arguments)::

    MCORE_DAPO_MUTATE=ddp-local torchrun --nproc-per-node 4 -m mcore_dapo_checks.logits --hf-path DIR \
        --reference REF.pt --tp 2 --ep 2 --backward

``MCORE_DAPO_MUTATE``: ``ddp-local`` (the data-parallel gradient reduction replaced by the local gradient times the
group size), ``ddp-local-experts`` (the same for the experts' expert-data-parallel reduction only),
``dispatch-swap`` (the alltoall dispatcher's received chunks of source ranks 0 and 1 swapped). Unset: the product's
check unchanged (the tests launch this module).
"""

from __future__ import annotations

import functools
import os
import sys

from mcore_dapo.convert.forward_check import parse_args, run

MUTATIONS = ("ddp-local", "ddp-local-experts", "dispatch-swap")


def _mutate(kind: str) -> None:
    """Break Megatron on purpose (``MCORE_DAPO_MUTATE``): each must fail the comparison."""
    import torch

    from mcore_dapo.errors import accepted

    if kind in ("ddp-local", "ddp-local-experts"):
        from megatron.core.distributed import param_and_grad_buffer as pgb

        reduce = pgb._ParamAndGradBucketGroup.start_grad_sync

        def local(self, force_all_reduce=False):
            # the experts' buckets (their parameters marked allreduce=False) only, with ddp-local-experts
            if kind == "ddp-local-experts" and all(getattr(p, "allreduce", True) for p in self.params):
                return reduce(self, force_all_reduce)
            # no communication: every rank takes its own gradient for the group's sum
            for bucket in self.buckets:
                bucket.grad_data *= bucket.gradient_scaling_factor * self.data_parallel_group.size()

        pgb._ParamAndGradBucketGroup.start_grad_sync = local
    elif kind == "dispatch-swap":
        from megatron.core.transformer.moe import token_dispatcher as td

        cls, original, dispatching = td.MoEAlltoAllTokenDispatcher, td.all_to_all, [False]
        name = "token_dispatch" if hasattr(cls, "token_dispatch") else "token_permutation"  # 0.16 / 0.12

        def swapped(group, input_, output_split_sizes=None, input_split_sizes=None):
            out = original(group, input_, output_split_sizes, input_split_sizes)
            if not dispatching[0] or group.size() < 2:
                return out
            sizes = output_split_sizes
            sizes = [out.shape[0] // group.size()] * group.size() if sizes is None else [int(x) for x in sizes]
            parts = list(torch.split(out, sizes, dim=0))
            parts[0], parts[1] = parts[1], parts[0]
            return torch.cat(parts, dim=0)

        def dispatch(self, *args, **kwargs):
            dispatching[0] = True
            try:
                return getattr(cls, "_unmutated")(self, *args, **kwargs)
            finally:
                dispatching[0] = False

        cls._unmutated = getattr(cls, name)
        setattr(cls, name, dispatch)
        td.all_to_all = swapped
    else:
        raise accepted("MCORE_DAPO_MUTATE", kind, f"one of {', '.join(MUTATIONS)}")


def _prepare() -> None:
    if os.environ.get("MCORE_DAPO_MUTATE"):
        _mutate(os.environ["MCORE_DAPO_MUTATE"])


def main(argv=None) -> int:
    from mcore_dapo.runtime.launch import worker_main

    return worker_main(parse_args, functools.partial(run, prepare=_prepare), argv)


if __name__ == "__main__":
    sys.exit(main())
