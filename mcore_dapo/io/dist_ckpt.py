"""Megatron torch_dist checkpoints of this rank's model chunks (written and read under any layout)."""

from __future__ import annotations


def sharded_state_dict(chunks) -> dict:
    """The sharded state dict Megatron's ``dist_checkpointing`` saves and loads for these chunks."""
    if len(chunks) == 1:
        return chunks[0].sharded_state_dict()
    return {f"model{i}": c.sharded_state_dict() for i, c in enumerate(chunks)}


def save_dist_checkpoint(chunks, path) -> None:
    from megatron.core import dist_checkpointing

    dist_checkpointing.save(sharded_state_dict(chunks), str(path))


def load_dist_checkpoint(chunks, path) -> None:
    """Load a torch_dist checkpoint (written under any layout) into this rank's model chunks."""
    from megatron.core import dist_checkpointing

    state = dist_checkpointing.load(sharded_state_dict(chunks), str(path))
    for i, c in enumerate(chunks):
        c.load_state_dict(state if len(chunks) == 1 else state[f"model{i}"], strict=True)
