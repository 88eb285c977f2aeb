"""The background writer of checkpoints (mcore_dapo/io/async_save.py) on its own: 2 torchrun ranks, gloo on the
CPU, megatron-core's persistent checkpoint worker (mcore_dapo_checks.check_async_save).

* What is written is what the ranks held when the save was scheduled, though the tensor changes right after
  (the next update): the trainer copies a host tensor into shared memory before the worker gets it. The save is
  loaded back whole on every rank and every rank's shard is held, bit for bit and by crc32, against that rank's
  values at the save (a clone taken before the writer saw the tensor, gathered from every rank). Mutations:
  without that copy (``stage_host_tensors`` returning the buckets as they are) the saved values were the changed
  ones; the copy skipped on rank 1 alone (``MCORE_DAPO_MUTATE=skip-staging-rank1``, in the check's process) fails
  rank 1's shard.
* A rank with nothing to write (a replica) finishes its save like the others.
* A background write that fails on one rank makes every rank's poll raise, naming that rank, and the save's
  last steps (record, rename, tracker in the checkpoint manager) do not run.
"""

import pytest

from mcore_dapo.runtime.launch import torchrun

pytestmark = pytest.mark.ranks(2)


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    return torchrun("mcore_dapo_checks.check_async_save", ["--work", str(tmp_path_factory.mktemp("async"))], 2,
                    timeout=600)


def test_what_is_written_is_what_the_ranks_held_at_the_save(checked):
    # per rank of the save, as each rank loaded it back: every shard is its rank's values at the save
    assert checked["shards_at_save"] == [[True, True], [True, True]], checked["shards_at_save"]
    assert checked["shards_after_change"] == [[False, False], [False, False]]
    assert checked["loaded_crc32"] == [checked["held_crc32"]] * 2
    assert len(set(checked["held_crc32"])) == 2  # the two shards hold different values
    assert checked["worker_pid"] > 0  # written by the persistent worker process
    assert checked["steps_run"][0] == "finished-1"


def test_a_rank_with_nothing_to_write_finishes_too(checked):
    """megatron-core's caller gives a rank with nothing to write no work for its worker (``async_fn`` None), and
    a poll of a worker started beforehand then waits for ever (seen: verl's trainer hung at its last save, whose
    memory-efficient reshardable format has only each data-parallel group's rank 0 write)."""
    assert checked["nothing_to_write"] == [False, True]
    assert checked["steps_run"][:2] == ["finished-1", "finished-replica"]


def test_a_failed_background_write_raises_on_every_rank_naming_it(checked):
    for msg in checked["failure"]:
        assert msg is not None and "test-2" in msg and 'rank(s) 1 (OSError("disk full' in msg
    assert "finished-2" not in checked["steps_run"] and not checked["pending_after_failure"]
