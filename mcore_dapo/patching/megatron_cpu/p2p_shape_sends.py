"""``cpu.megatron.p2p-shape-sends`` (megatron-core 0.14 on: ``P2PCommunicator``'s methods) and
``cpu.megatron.p2p-shape-sends-functions`` (before 0.14: the module's functions): with variable sequence
lengths, the pipeline's point-to-point shape exchange no longer waits for its own sends.

With ``variable_seq_lengths`` (the alltoall dispatcher's and verl's setting) every pipeline
communication (``_communicate`` in ``megatron/core/pipeline_parallel/p2p_communication.py``) first
exchanges the shapes of the tensors it sends (``_communicate_shapes``) and waits for all of it, sends
included, before it posts the tensors themselves. A gloo send completes only once the peer has posted the
matching receive (NCCL's small sends complete without it). In the interleaved schedule a stage can then
wait in a shape exchange for the peer to receive a gradient's shape while the peer waits for this stage to
receive an activation (PP2 x VPP2: the first stage's last warm-up send against the last stage's first
steady-state step, ``forward_backward_pipelining_with_interleaving`` in ``schedules.py``), and both hang.

Here the shapes are sent first, without waiting, on the group Megatron sends them on, and Megatron's own
``_communicate_shapes`` only receives. Each shape send is waited for with the tensor it describes: right
after ``_communicate`` has waited for its tensors, or, when it returns its requests unwaited
(``overlap_p2p_comm``), when the schedule waits for that tensor's send. Every message is posted in the
order Megatron posts it (a tensor's shape before the tensor, on each pair), so the matching is Megatron's;
only the moment a shape send is waited for moves, to where a fixed-length exchange waits for its send.
"""

from __future__ import annotations

import threading

import torch

from mcore_dapo.patching.patcher import Patcher
from mcore_dapo.patching.registry import implements

MODULE = "megatron.core.pipeline_parallel.p2p_communication"

_state = threading.local()  # .sends: the shape sends of the _communicate now running, as (key, work)


class _Both:
    """A tensor's send request that also waits for its shape's send (what Megatron's schedules call: wait)."""

    def __init__(self, shape_send, send):
        self._shape_send, self._send = shape_send, send

    def wait(self, *args, **kwargs):
        self._shape_send.wait()
        return self._send.wait(*args, **kwargs)


def _post(sends, group) -> list:
    """Post the shape of each ``(key, tensor, peer)`` without waiting; the (key, request) pairs."""
    return [(key, torch.distributed.isend(torch.tensor(t.size(), dtype=torch.int64), peer, group=group))
            for key, t, peer in sends if t is not None]


def _after(result):
    """``_communicate``'s result with this call's shape sends waited for, or attached to the unwaited
    requests of the tensors they describe."""
    sends = _state.sends
    if not sends:
        return result
    recv_prev, recv_next, reqs = result
    for key, work in sends:
        if isinstance(reqs, dict) and key in reqs:
            reqs[key] = _Both(work, reqs[key])
        else:  # the tensors' requests were waited for: so was the shape's receive, posted before
            work.wait()
    return recv_prev, recv_next, reqs


def _communicate(original):
    def _communicate(*args, **kwargs):
        outer = getattr(_state, "sends", None)
        _state.sends = []
        try:
            return _after(original(*args, **kwargs))
        finally:
            _state.sends = outer

    return _communicate


def _single_rank(*ranks) -> bool:
    return all(isinstance(r, int) for r in ranks)


def _shapes_method(original):
    def _communicate_shapes(self, tensor_send_next, tensor_send_prev, recv_prev, recv_next):
        if getattr(_state, "sends", None) is None or self.config.use_ring_exchange_p2p \
                or not _single_rank(self.prev_rank, self.next_rank):
            return original(self, tensor_send_next, tensor_send_prev, recv_prev, recv_next)
        # Megatron's order: the previous stage's shape, then the next's
        _state.sends += _post([("send_prev", tensor_send_prev, self.prev_rank),
                               ("send_next", tensor_send_next, self.next_rank)], self.pp_group)
        return original(self, None, None, recv_prev, recv_next)

    return _communicate_shapes


def _shapes_function(original):
    def _communicate_shapes(tensor_send_next, tensor_send_prev, recv_prev, recv_next, config):
        from megatron.core import parallel_state as ps

        prev_rank, next_rank = ps.get_pipeline_model_parallel_prev_rank(), ps.get_pipeline_model_parallel_next_rank()
        if getattr(_state, "sends", None) is None or config.use_ring_exchange_p2p \
                or not _single_rank(prev_rank, next_rank):
            return original(tensor_send_next, tensor_send_prev, recv_prev, recv_next, config)
        # Megatron's order and group (its P2POps name none: the default group)
        _state.sends += _post([("send_prev", tensor_send_prev, prev_rank),
                               ("send_next", tensor_send_next, next_rank)], None)
        return original(None, None, recv_prev, recv_next, config)

    return _communicate_shapes


@implements("cpu.megatron.p2p-shape-sends")
def _p2p_shape_sends(patch: Patcher) -> None:
    patch.wrap(_communicate, f"{MODULE}:P2PCommunicator._communicate")
    patch.wrap(_shapes_method, f"{MODULE}:P2PCommunicator._communicate_shapes")


@implements("cpu.megatron.p2p-shape-sends-functions")
def _p2p_shape_sends_functions(patch: Patcher) -> None:
    patch.wrap(_communicate, f"{MODULE}:_communicate")
    patch.wrap(_shapes_function, f"{MODULE}:_communicate_shapes")
