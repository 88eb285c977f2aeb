"""One weight sync, trainer -> receiver, with the receiver checked first and checksums optional."""

from __future__ import annotations

import torch

from mcore_dapo.errors import UserError
from mcore_dapo.resharding.export import SyncStats, WeightExporter
from mcore_dapo.resharding.verify import ChecksumMismatch, check_receiver, checksum, compare_checksums


def _agree(ok: bool, exporter: WeightExporter) -> bool:
    """True when the receivers of every rank passed the check (one tiny all-reduce over the world)."""
    import torch.distributed as dist

    if dist_world_size() == 1:
        return ok
    flag = torch.tensor([1 if ok else 0], device=exporter.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def check_before_writing(exporter: WeightExporter, receiver) -> None:
    """Names and shapes of the plan against ``receiver.expected_weights()``, on every rank, before any write.

    A receiver that does not match on one rank makes every rank raise (none starts
    streaming, so no rank is left waiting in a collective).
    """
    expected = getattr(receiver, "expected_weights", None)
    exporter.plan  # built on every rank (collective), also where this rank's receiver has nothing to check
    error = None
    if expected is not None:
        try:
            check_receiver(((n, s) for n, s, _ in exporter.plan.hf_specs()), expected())
        except UserError as e:
            error = e
    if not _agree(error is None, exporter):
        raise error or UserError("the receiving model of another rank does not match the trainer; nothing was written")


def sync_weights(exporter: WeightExporter, receiver, *, verify: bool = False, progress: bool = False) -> SyncStats:
    """Stream the trainer's weights into ``receiver.load_weights``; return the exporter's statistics.

    ``verify``: the trainer sends per-tensor checksums; the receiver's copy is
    read back (``read_weight``) or, for receivers without it, the received tensors
    are summed; any difference raises :class:`ChecksumMismatch` once the stream
    has ended (every rank finishes the collectives first, so none hangs). Checksums
    compare bits: export in the dtype the receiver holds.
    """
    check_before_writing(exporter, receiver)
    read = getattr(receiver, "read_weight", None)
    bad: list[tuple[str, int, int]] = []
    for bucket in exporter.buckets(checksums=verify, progress=progress):
        received = {n: checksum(t) for n, t in bucket.items} if verify and read is None else None
        receiver.load_weights(bucket.items)
        if not verify:
            continue
        dtypes = {n: t.dtype for n, t in bucket.items}
        got = received if received is not None else {n: checksum(read(n).to(dtypes[n])) for n in dtypes}
        bad += [(n, bucket.checksums[n], got.get(n)) for n in compare_checksums(bucket.checksums, got)]
    if bad:
        name, want, have = bad[0]
        raise ChecksumMismatch(
            f"{len(bad)} tensor(s) differ between trainer and receiver after the sync; first {name!r}: "
            f"trainer checksum {want}, receiver {have}"
        )
    stats = exporter.last_stats
    if dist_world_size() > 1:
        stats.collectives.add("world", 4)  # the agreement on the receiver check
    return stats


def dist_world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_initialized() else 1
