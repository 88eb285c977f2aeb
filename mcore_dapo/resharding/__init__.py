"""Rollout resharding: stream trained Megatron weights (any TP/PP/EP/ETP) into a rollout engine.

Producer and transport are apart: :class:`WeightExporter` turns a rank's model
chunks into buckets of ``(hf_name, full tensor)`` with coalesced collectives
(one per bucket and process group) following a plan built once; anything with
``load_weights(iterable)`` consumes them (vLLM's models, or
:class:`HFQwen3MoeReceiver` for an HF transformers model). :func:`sync_weights`
checks the receiver's names and shapes before writing and, on request,
per-tensor checksums after. See docs/RESHARDING.md.
"""

from mcore_dapo.resharding.comm import CollectiveCounter, Groups
from mcore_dapo.resharding.export import DEFAULT_BUCKET_BYTES, Bucket, SyncStats, WeightExporter
from mcore_dapo.resharding.receivers import HFQwen3MoeReceiver
from mcore_dapo.resharding.transfer import check_before_writing, sync_weights
from mcore_dapo.resharding.verify import ChecksumMismatch, check_receiver, checksum

__all__ = [
    "Bucket", "ChecksumMismatch", "CollectiveCounter", "DEFAULT_BUCKET_BYTES", "Groups", "HFQwen3MoeReceiver",
    "SyncStats", "WeightExporter", "check_before_writing", "check_receiver", "checksum", "sync_weights",
]
