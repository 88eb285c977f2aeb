"""The gloo checkpoint engine (``mcore_dapo.verl_cpu.checkpoint_engine``, verl's weight transport for
``separate_async`` on a host without an accelerator) between real processes, as verl's CheckpointEngineManager
drives it (``mcore_dapo_checks/check_checkpoint_engine.py``: two trainer ranks with a gloo group of their own, one rollout
rank, two syncs in one launch, each with its own process group as verl rebuilds one per sync): the tensors arrive
bit for bit, over several buckets and a tensor split in chunks, while a trainer rank that yields another stream than
rank 0 fails the sync naming it; a byte changed on the way fails the next sync before the consumer commits (the
rollout keeps the weights it had). And verl registers it through ``checkpoint_engine.custom_backend_module``.
Where: M, A; ``cpu_only`` (gloo between host processes)."""

import pytest

pytestmark = [pytest.mark.cpu_only, pytest.mark.timeout(600)]

pytest.importorskip("verl")


@pytest.fixture(scope="module")
def syncs(tmp_path_factory):
    from mcore_dapo_checks.check_checkpoint_engine import run

    r = run(tmp_path_factory.mktemp("checkpoint-engine"))
    assert all(e is None for e in r["exits"].values()), r["exits"]
    return r


def test_weights_arrive_bit_for_bit_and_a_rank_walking_another_order_fails_the_sync(syncs):
    # trainer rank 1 yields its tensors in another order than rank 0 (verl's relay ranks would cut other bucket
    # boundaries from such a stream). Rank 0's stream, the one sent, arrives bit for bit over several buckets and a
    # tensor split in chunks, with the sender's and the receiver's hashes equal; then both trainer ranks raise,
    # naming rank 1
    r = syncs["syncs"][3]
    assert r["mutation"] == "order"
    assert r["received"] == {"names": syncs["sent"], "committed": True, "equal": True}
    send = [s for s in syncs["sync"] if s["side"] == "send" and s["step"] == 3]
    receive = [s for s in syncs["sync"] if s["side"] == "receive" and s["step"] == 3]
    assert len(receive) == 1
    assert r["errors"]["rollout0"] is None, r["errors"]
    for rank in ("trainer0", "trainer1"):
        assert "ranks [1] yielded another weight stream than rank 0" in (r["errors"][rank] or ""), r["errors"]
    assert len(send) == 1 and send[0]["hash"] == receive[0]["hash"]
    assert send[0]["bytes"] == receive[0]["bytes"] > 4096  # more than one bucket


def test_a_corrupted_bucket_fails_before_the_consumer_commits(syncs):
    # mutation: one byte of the second bucket flipped on the rollout's side after its broadcast, in the next sync
    # (a group of its own: the failed sync before it left nothing behind)
    r = syncs["syncs"][4]
    assert r["mutation"] == "corrupt"
    assert "arrived corrupted" in (r["errors"]["rollout0"] or ""), r["errors"]
    assert r["received"]["committed"] is False  # the last tensor never reached the consumer
    assert len(r["received"]["names"]) < len(syncs["sent"])
    assert r["errors"]["trainer0"] is None and r["errors"]["trainer1"] is None, r["errors"]


def test_verl_finds_the_backend_through_custom_backend_module():
    from mcore_dapo.verl_cpu import checkpoint_engine as ce
    from verl.checkpoint_engine import CheckpointEngineRegistry
    from verl.utils.import_utils import import_external_libs

    from mcore_dapo.devices import get_adapter

    name, module = get_adapter("cpu").rollout.checkpoint_engine()  # what the launch scripts put in the key
    assert (name, module) == (ce.NAME, ce.__name__)
    import_external_libs(module)  # what verl's workers and its CheckpointEngineManager do with the key
    assert CheckpointEngineRegistry.get(ce.NAME) is ce.GlooCheckpointEngine
    actor, rollout = ce.GlooCheckpointEngine.build_topology(3, 2, ["m", None, None, None, None])
    assert actor["rank"] == [0, -1, -1] and rollout["rank"] == [1, 2]
    assert actor["world_size"] == [3] * 3 and rollout["world_size"] == [3] * 2


def test_the_senders_store_listens_from_prepare():
    # the port the sender announces is held from prepare() on (a port found free and bound only in
    # init_process_group was taken in between once: EADDRINUSE at a run's first sync): a member can connect before
    # the sender forms the group
    from datetime import timedelta

    import torch.distributed as dist

    from mcore_dapo.verl_cpu import checkpoint_engine as ce

    engine = ce.GlooCheckpointEngine(bucket_size=4096, is_master=True)
    meta = engine.prepare()
    member = dist.TCPStore(meta.host, meta.port, 2, is_master=False, timeout=timedelta(seconds=10))
    member.set("joined", "1")
    assert engine.store.get("joined") == b"1"
    engine.finalize()
