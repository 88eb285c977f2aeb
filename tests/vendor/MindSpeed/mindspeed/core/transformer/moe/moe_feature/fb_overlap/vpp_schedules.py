# pylint: skip-file
# Copyright (c) 2022, NVIDIA CORPORATION. All rights reserved.
# Copyright (c) Huawei Technologies Co., Ltd. 2025-2025. All rights reserved.

import contextlib
from typing import Iterator, List, Union
from functools import partial, wraps
import torch
from megatron.core import parallel_state
from megatron.core.enums import ModelType
from megatron.core.pipeline_parallel import p2p_communication
from megatron.core.pipeline_parallel.schedules import (
    deallocate_output_tensor,
    set_current_microbatch,
    check_first_val_step,
    clear_embedding_activation_buffer,
    finish_embedding_wgrad_compute,
    custom_backward,
)
from megatron.core.transformer.moe.router import MoEAuxLossAutoScaler
from megatron.core.utils import (
    get_attr_wrapped_model,
    get_model_config,
    get_model_type,
)
from megatron.core.transformer.multi_token_prediction import MTPLossAutoScaler

from mindspeed.args_utils import get_full_args as get_args
from .gpt_model import gpt_model_backward
from .modules.utils import P2PCommParams


LOSS_BACKWARD_SCALE = torch.tensor(1.0)
# Types
Shape = Union[List[int], torch.Size]


def has_pipeline_model_parallel_layout(config):
    """Return whether custom pipeline layout is active for this model config."""
    if getattr(config, 'pipeline_model_parallel_layout', None) is not None:
        return True
    args = get_args()
    return getattr(args, 'pipeline_model_parallel_layout', None) is not None


def is_pipeline_first_stage_for_chunk(model_chunk_id, num_model_chunks, use_layout):
    if use_layout:
        return parallel_state.is_pipeline_first_stage(ignore_virtual=True) and model_chunk_id == 0
    return parallel_state.is_pipeline_first_stage()


def is_pipeline_last_stage_for_chunk(model_chunk_id, num_model_chunks, use_layout):
    if use_layout:
        return parallel_state.is_pipeline_last_stage(ignore_virtual=True) and model_chunk_id == num_model_chunks - 1
    return parallel_state.is_pipeline_last_stage()


def get_schedule_table(num_microbatches, num_model_chunks, microbatch_group_size_per_vp_stage):
    """Get the layout-aware schedule table from Megatron dev."""
    schedule_table = []
    for min_microbatch_id_in_group in range(0, num_microbatches, microbatch_group_size_per_vp_stage):
        if min_microbatch_id_in_group + microbatch_group_size_per_vp_stage >= num_microbatches:
            schedule_table.extend(
                [
                    (microbatch_id, model_chunk_id)
                    for model_chunk_id in range(num_model_chunks)
                    for microbatch_id in range(min_microbatch_id_in_group, num_microbatches)
                ]
            )
        else:
            schedule_table.extend(
                [
                    (microbatch_id, model_chunk_id)
                    for model_chunk_id in range(num_model_chunks)
                    for microbatch_id in range(
                        min_microbatch_id_in_group,
                        min_microbatch_id_in_group + microbatch_group_size_per_vp_stage,
                    )
                ]
            )
    return schedule_table


def forward_step(
    forward_step_func,
    data_iterator,
    model,
    num_microbatches,
    input_tensor,
    forward_data_store,
    config,
    collect_non_loss_data=False,
    checkpoint_activations_microbatch=None,
    is_first_microbatch=False,
    current_microbatch=None,
    encoder_decoder_xattn=False,
    extra_block_kwargs=None,
):
    """Forward step for passed-in model.

    If first stage, input tensor is obtained from data_iterator, otherwise
    passed-in input_tensor is used.

    Returns output tensor.
    """
    if config.timers is not None:
        config.timers('forward-compute', log_level=2).start()

    if is_first_microbatch and hasattr(model, 'set_is_first_microbatch'):
        model.set_is_first_microbatch()
    if current_microbatch is not None:
        set_current_microbatch(model, current_microbatch)

    unwrap_output_tensor = False
    if not isinstance(input_tensor, list):
        input_tensor = [input_tensor]
        unwrap_output_tensor = True

    set_input_tensor = get_attr_wrapped_model(model, "set_input_tensor")
    set_input_tensor(input_tensor)
    block = get_attr_wrapped_model(model, 'decoder')

    if config.enable_autocast:
        context_manager = torch.autocast("cuda", dtype=config.autocast_dtype)
    else:
        context_manager = contextlib.nullcontext()
    with context_manager:
        if checkpoint_activations_microbatch is None:
            output_tensor, loss_func = forward_step_func(data_iterator, model, extra_block_kwargs=extra_block_kwargs)
        else:
            output_tensor, loss_func = forward_step_func(
                data_iterator, model, checkpoint_activations_microbatch, extra_block_kwargs=extra_block_kwargs
            )

    num_tokens = torch.tensor(0, dtype=torch.int)
    is_last_stage = parallel_state.is_pipeline_last_stage()
    if has_pipeline_model_parallel_layout(config):
        vp_stage = parallel_state.get_virtual_pipeline_model_parallel_rank()
        vp_size = parallel_state.get_virtual_pipeline_model_parallel_world_size()
        is_last_stage = parallel_state.is_pipeline_last_stage(ignore_virtual=True) and (
            vp_size is None or vp_stage == vp_size - 1
        )
    if is_last_stage:
        if not collect_non_loss_data:
            outputs = loss_func(output_tensor)
            if len(outputs) == 3:
                output_tensor, num_tokens, loss_reduced = outputs
                if not config.calculate_per_token_loss:
                    output_tensor /= num_tokens
                    output_tensor *= parallel_state.get_context_parallel_world_size()
                    output_tensor /= num_microbatches
            else:
                # preserve legacy loss averaging behavior (ie, over the number of microbatches)
                assert len(outputs) == 2
                output_tensor, loss_reduced = outputs
                output_tensor *= parallel_state.get_context_parallel_world_size()
                output_tensor /= num_microbatches
            forward_data_store.append(loss_reduced)
        else:
            data = loss_func(output_tensor, non_loss_data=True)
            forward_data_store.append(data)

    next_info = None
    model_graph = block.get_fwd_layer_graphs()
    if extra_block_kwargs is not None:
        next_info = block.get_pp_comm_output()
    output_tensor = (output_tensor, model_graph, next_info) if next_info is not None else (output_tensor, model_graph)

    if config.timers is not None:
        config.timers('forward-compute').stop()

    # Set the loss scale for the auxiliary loss of the MoE layer.
    # Since we use a trick to do backward on the auxiliary loss, we need to set the scale explicitly.
    if hasattr(config, 'num_moe_experts') and config.num_moe_experts is not None:
        # Calculate the loss scale based on the grad_scale_func if available, else default to 1.
        loss_scale = (
            config.grad_scale_func(LOSS_BACKWARD_SCALE) if config.grad_scale_func is not None else torch.tensor(1.0)
        )
        # Set the loss scale
        MoEAuxLossAutoScaler.set_loss_scale(loss_scale / num_microbatches)

    # Set the loss scale for Multi-Token Prediction (MTP) loss.
    if hasattr(config, 'mtp_num_layers') and config.mtp_num_layers is not None:
        # Calculate the loss scale based on the grad_scale_func if available, else default to 1.
        loss_scale = (
            config.grad_scale_func(torch.ones(1, device=output_tensor[0].device))
            if config.grad_scale_func is not None
            else torch.ones(1, device=output_tensor[0].device)
        )
        # Set the loss scale
        if config.calculate_per_token_loss:
            MTPLossAutoScaler.set_loss_scale(loss_scale)
        else:
            MTPLossAutoScaler.set_loss_scale(loss_scale / num_microbatches)

    # If T5 model (or other model with encoder and decoder)
    # and in decoder stack, then send encoder_hidden_state
    # downstream as well.
    model_type = get_model_type(model)
    if parallel_state.is_pipeline_stage_after_split() and model_type == ModelType.encoder_and_decoder:
        return [output_tensor, input_tensor[-1]], num_tokens

    if unwrap_output_tensor:
        return output_tensor, num_tokens
    return [output_tensor], num_tokens


def backward_step(input_tensor, output_tensor, output_tensor_grad, model_type, config, model_graph=None):
    """Backward step through passed-in output tensor.

    If last stage, output_tensor_grad is None, otherwise gradient of loss
    with respect to stage's output tensor.

    Returns gradient of loss with respect to input tensor (None if first
    stage).
    """

    # NOTE: This code currently can handle at most one skip connection. It
    # needs to be modified slightly to support arbitrary numbers of skip
    # connections.

    if config.timers is not None:
        config.timers('backward-compute', log_level=2).start()

    # Retain the grad on the input_tensor.
    unwrap_input_tensor_grad = False
    if not isinstance(input_tensor, list):
        input_tensor = [input_tensor]
        unwrap_input_tensor_grad = True
    for x in input_tensor:
        if x is not None:
            x.retain_grad()

    if not isinstance(output_tensor, list):
        output_tensor = [output_tensor]
    if not isinstance(output_tensor_grad, list):
        output_tensor_grad = [output_tensor_grad]

    # Backward pass.
    if output_tensor_grad[0] is None and config.grad_scale_func is not None and model_graph is None:
        output_tensor[0] = config.grad_scale_func(output_tensor[0])

    if config.deallocate_pipeline_outputs:
        if model_graph is None:
            custom_backward(output_tensor[0], output_tensor_grad[0])
        else:
            layer_output_grad = gpt_model_backward(output_tensor_grad[0], model_graph)
    else:
        torch.autograd.backward(output_tensor[0], grad_tensors=output_tensor_grad[0])

    # Collect the grad of the input_tensor.
    input_tensor_grad = [None]
    if input_tensor is not None:
        input_tensor_grad = []
        if model_graph is not None:
            input_tensor_grad.append(layer_output_grad)
        else:
            for x in input_tensor:
                if x is None:
                    input_tensor_grad.append(None)
                else:
                    input_tensor_grad.append(x.grad)

    # Handle single skip connection if it exists (encoder_hidden_state in
    # model with encoder and decoder).
    if (
        parallel_state.get_pipeline_model_parallel_world_size() > 1
        and parallel_state.is_pipeline_stage_after_split()
        and model_type == ModelType.encoder_and_decoder
    ):
        if output_tensor_grad[1] is not None:
            input_tensor_grad[-1].add_(output_tensor_grad[1])
    if unwrap_input_tensor_grad:
        input_tensor_grad = input_tensor_grad[0]

    if config.timers is not None:
        config.timers('backward-compute').stop()

    return input_tensor_grad


def forward_step_func_wrapper(fn):
    """A wrapper for user defined forward_step_func.
    Set the extra_block_kwargs parameter for GPTModel Forward.
    extra_block_kwargs are used for bypassing parameter needed for backward. Used for forward&backward overlaping.
    """

    @wraps(fn)
    def wrapper(data_iterator, model, extra_block_kwargs=None):
        orig_model_forward_func = model.forward
        model.forward = partial(model.forward, extra_block_kwargs=extra_block_kwargs)
        out = fn(data_iterator, model)
        model.forward = orig_model_forward_func

        return out

    return wrapper


def forward_backward_pipelining_with_interleaving(
    *,
    forward_step_func,
    data_iterator: Union[Iterator, List[Iterator]],
    model: Union[torch.nn.Module, List[torch.nn.Module]],
    num_microbatches: int,
    seq_length: int,
    micro_batch_size: int,
    decoder_seq_length: int = None,
    forward_only: bool = False,
    collect_non_loss_data: bool = False,
    first_val_step: bool = None,
):
    """Run interleaved 1F1B schedule (model split into model chunks), with
    communication between pipeline stages as needed.

    Returns dictionary with losses if the last stage, empty dict otherwise.
    """
    assert isinstance(model, list), "interleaved pipeline parallelism expected model chunking"
    assert all(isinstance(chunk, torch.nn.Module) for chunk in model), "invalid model chunking"
    assert isinstance(data_iterator, list), (
        "interleaved pipeline parallelism expected each model chunk to have a data iterator"
    )
    # should overide forward step func with extra_block_kwargs passed in
    forward_step_func = forward_step_func_wrapper(forward_step_func)

    config = get_model_config(model[0])
    if config.overlap_p2p_comm and config.batch_p2p_comm:
        raise ValueError("Can not use both overlap_p2p_comm and batch_p2p_comm")

    # Needed only when gradients are finalized in M-Core
    if config.finalize_model_grads_func is not None and not forward_only:
        embedding_module = clear_embedding_activation_buffer(config, model)

    if config.timers is not None:
        config.timers('forward-backward', log_level=1).start(barrier=config.barrier_with_L1_time)

    # Disable async grad reductions
    no_sync_func = config.no_sync_func
    if isinstance(no_sync_func, list):

        def multi_no_sync():
            stack = contextlib.ExitStack()
            for model_chunk_no_sync_func in config.no_sync_func:
                stack.enter_context(model_chunk_no_sync_func())
            return stack

        no_sync_func = multi_no_sync
    if no_sync_func is None:
        no_sync_func = contextlib.nullcontext
    no_sync_context = None

    if config.grad_sync_func is not None and not isinstance(config.grad_sync_func, list):
        config.grad_sync_func = [config.grad_sync_func for _ in model]

    if config.param_sync_func is not None and not isinstance(config.param_sync_func, list):
        config.param_sync_func = [config.param_sync_func for _ in model]

    def disable_grad_sync():
        """Disable asynchronous grad reductions"""
        nonlocal no_sync_context
        if no_sync_context is None:
            no_sync_context = no_sync_func()
            no_sync_context.__enter__()

    def enable_grad_sync():
        """Enable asynchronous grad reductions"""
        nonlocal no_sync_context
        if no_sync_context is not None:
            no_sync_context.__exit__(None, None, None)
            no_sync_context = None

    disable_grad_sync()

    # Model chunk IDs with synchronized grads
    synchronized_model_chunks = set()

    input_tensors = [[] for _ in range(len(model))]
    output_tensors = [[] for _ in range(len(model))]
    model_graphs = [[] for _ in range(len(model))]
    logits_inputs = []
    total_num_tokens = torch.tensor(0, dtype=torch.int).cuda()

    forward_data_store = []
    if not forward_only:
        output_tensor_grads = [[] for _ in range(len(model))]

    pipeline_parallel_size = parallel_state.get_pipeline_model_parallel_world_size()
    pipeline_parallel_rank = parallel_state.get_pipeline_model_parallel_rank()

    if num_microbatches % pipeline_parallel_size != 0:
        msg = f'number of microbatches ({num_microbatches}) is not divisible by '
        msg += f'pipeline-model-parallel-size ({pipeline_parallel_size}) '
        msg += 'when using interleaved schedule'
        raise RuntimeError(msg)

    model_type = get_model_type(model[0])
    if model_type == ModelType.encoder_and_decoder:
        raise RuntimeError("Interleaving is not supported with an encoder and decoder model.")

    if decoder_seq_length is not None and decoder_seq_length != seq_length:
        raise RuntimeError("Interleaving is not supported with a different decoder sequence length.")

    if getattr(config, 'enable_mhc', False):
        tensor_shape = [seq_length, micro_batch_size, config.hc_mult, config.hidden_size]
    else:
        tensor_shape = [seq_length, micro_batch_size, config.hidden_size]

    tensor_shape[0] = tensor_shape[0] // parallel_state.get_context_parallel_world_size()
    if config.sequence_parallel:
        tensor_shape[0] = tensor_shape[0] // parallel_state.get_tensor_model_parallel_world_size()

    # Compute number of warmup and remaining microbatches.
    num_model_chunks = len(model)
    use_pipeline_model_parallel_layout = has_pipeline_model_parallel_layout(config)
    microbatch_group_size_per_vp_stage = getattr(config, 'microbatch_group_size_per_vp_stage', None)
    if microbatch_group_size_per_vp_stage is None:
        microbatch_group_size_per_vp_stage = pipeline_parallel_size
    total_num_microbatches = num_microbatches * num_model_chunks
    all_warmup_microbatches = False

    if use_pipeline_model_parallel_layout:
        if forward_only:
            num_warmup_microbatches = total_num_microbatches
        else:
            if num_microbatches == pipeline_parallel_size:
                num_warmup_microbatches = total_num_microbatches
            else:
                num_warmup_microbatches = (pipeline_parallel_size - pipeline_parallel_rank - 1) * 2
                num_warmup_microbatches += (num_model_chunks - 1) * microbatch_group_size_per_vp_stage
                # Add one more warmup microbatch for fb overlap, same as Megatron dev
                # overlap_moe_expert_parallel_comm schedule.
                num_warmup_microbatches += 1
        if num_warmup_microbatches >= total_num_microbatches:
            num_warmup_microbatches = total_num_microbatches
            all_warmup_microbatches = True
    else:
        if forward_only:
            num_warmup_microbatches = total_num_microbatches
        else:
            # Run all forward passes and then all backward passes if number of
            # microbatches is just the number of pipeline stages.
            # Otherwise, perform (num_model_chunks-1)*pipeline_parallel_size on
            # all workers, followed by more microbatches after depending on
            # stage ID (more forward passes for earlier stages, later stages can
            # immediately start with 1F1B).
            if num_microbatches == pipeline_parallel_size:
                num_warmup_microbatches = total_num_microbatches
                all_warmup_microbatches = True
            else:
                num_warmup_microbatches = (pipeline_parallel_size - pipeline_parallel_rank - 1) * 2
                num_warmup_microbatches += (num_model_chunks - 1) * pipeline_parallel_size
                num_warmup_microbatches = min(num_warmup_microbatches, total_num_microbatches)
        # add one more warmup microbatches for 1f1b overlaping
        num_warmup_microbatches += 1
    num_microbatches_remaining = total_num_microbatches - num_warmup_microbatches

    # Checkpoint the activations of partial Transformer layers in a number of micro-batches
    # within the maximum outstanding micro-batch backpropagations.
    # Micro-batches with the ids less than 'num_microbatches_with_partial_activation_checkpoints'
    # checkpoint partial Transformer layers (or skip checkpointing) and
    # the rest of micro-batches within a window of micro-batches checkpoint
    # all Transformer layers. The window of micro-batches is set by the maximum
    # outstanding backpropagations and becomes smaller at later pipeline stages.
    # Please refer the appendix C in https://arxiv.org/pdf/2205.05198.pdf
    max_outstanding_backprops = None
    if config.num_microbatches_with_partial_activation_checkpoints is not None:
        max_outstanding_backprops = num_warmup_microbatches + 1

    # Synchronize params for first two model chunks
    if config.param_sync_func is not None:
        config.param_sync_func[0](model[0].parameters())
        config.param_sync_func[1](model[1].parameters())

    if use_pipeline_model_parallel_layout:
        schedule_table = get_schedule_table(num_microbatches, num_model_chunks, microbatch_group_size_per_vp_stage)
        microbatch_id_table, model_chunk_id_table = zip(*schedule_table)
    else:
        microbatch_id_table, model_chunk_id_table = None, None

    def get_model_chunk_id(microbatch_id, forward):
        """Helper method to get the model chunk ID given the iteration number."""
        if use_pipeline_model_parallel_layout:
            model_chunk_id = model_chunk_id_table[microbatch_id % total_num_microbatches]
            if not forward:
                model_chunk_id = num_model_chunks - model_chunk_id - 1
            return model_chunk_id
        microbatch_id_in_group = microbatch_id % (pipeline_parallel_size * num_model_chunks)
        model_chunk_id = microbatch_id_in_group // pipeline_parallel_size
        if not forward:
            model_chunk_id = num_model_chunks - model_chunk_id - 1
        return model_chunk_id

    def get_microbatch_id_in_model_chunk(iteration_id, forward):
        """Helper method to get the microbatch_id within model chunk given the iteration number."""
        assert forward
        if use_pipeline_model_parallel_layout:
            return microbatch_id_table[iteration_id]
        iteration_group_id = iteration_id // (pipeline_parallel_size * num_model_chunks)
        microbatch_id_in_model_chunk = (iteration_group_id * pipeline_parallel_size) + (
            iteration_id % pipeline_parallel_size
        )
        return microbatch_id_in_model_chunk

    def num_released_microbatches(microbatch_id, model_chunk_id):
        if not use_pipeline_model_parallel_layout:
            return 0
        if forward_only:
            return model_chunk_id_table[:microbatch_id].count(model_chunk_id)
        if microbatch_id < num_warmup_microbatches:
            return 0
        backward_microbatch_id = microbatch_id - num_warmup_microbatches
        backward_model_chunk_id = num_model_chunks - model_chunk_id - 1
        return model_chunk_id_table[:backward_microbatch_id].count(backward_model_chunk_id)

    def is_first_microbatch_for_model_chunk(microbatch_id: int) -> bool:
        """Check if an iteration is the first for a model chunk."""
        if use_pipeline_model_parallel_layout:
            return microbatch_id < total_num_microbatches and microbatch_id_table[microbatch_id] == 0
        microbatch_group_size = pipeline_parallel_size * num_model_chunks
        microbatch_group_id = microbatch_id // microbatch_group_size
        microbatch_id_in_group = microbatch_id % microbatch_group_size
        if microbatch_group_id == 0:
            return microbatch_id_in_group % pipeline_parallel_size == 0
        else:
            return False

    def is_last_microbatch_for_model_chunk(microbatch_id: int) -> bool:
        """Check if an iteration is the last for a model chunk."""
        if use_pipeline_model_parallel_layout:
            return microbatch_id < total_num_microbatches and microbatch_id_table[microbatch_id] == num_microbatches - 1
        microbatch_group_size = pipeline_parallel_size * num_model_chunks
        num_microbatch_groups = total_num_microbatches // microbatch_group_size
        microbatch_group_id = microbatch_id // microbatch_group_size
        microbatch_id_in_group = microbatch_id % microbatch_group_size
        if microbatch_group_id == num_microbatch_groups - 1:
            return microbatch_id_in_group % pipeline_parallel_size == pipeline_parallel_size - 1
        else:
            return False

    def recv_tensor_from_previous_stage(microbatch_id, forward):
        if not use_pipeline_model_parallel_layout:
            return True, get_model_chunk_id(microbatch_id + 1, forward=forward)

        recv = True
        is_leading_pipeline_stage = (
            parallel_state.is_pipeline_first_stage(ignore_virtual=True)
            if forward
            else parallel_state.is_pipeline_last_stage(ignore_virtual=True)
        )
        last_model_chunk = num_model_chunks - 1 if forward else 0

        if is_leading_pipeline_stage:
            if microbatch_id < (pipeline_parallel_size - 1):
                recv = False
                next_model_chunk_id = get_model_chunk_id(microbatch_id + 1, forward)
            else:
                next_model_chunk_id = get_model_chunk_id(microbatch_id - (pipeline_parallel_size - 1), forward)
            if next_model_chunk_id == last_model_chunk:
                recv = False
            if forward:
                next_model_chunk_id += 1
            else:
                next_model_chunk_id -= 1
        else:
            next_model_chunk_id = get_model_chunk_id(microbatch_id + 1, forward)

        return recv, next_model_chunk_id

    def forward_step_helper(
        microbatch_id, current_microbatch, checkpoint_activations_microbatch, extra_block_kwargs=None, backward_k=None
    ):
        """Helper method to run forward step with model split into chunks
        (run set_virtual_pipeline_model_parallel_rank() before calling
        forward_step()).
        """
        model_chunk_id = get_model_chunk_id(microbatch_id, forward=True)
        parallel_state.set_virtual_pipeline_model_parallel_rank(model_chunk_id)

        # launch param synchronization for next model chunk
        # Note: Asynchronous communication tends to slow down compute.
        # To reduce idling from mismatched microbatch times, we launch
        # asynchronous communication at the same time across the
        # pipeline-parallel group.
        if config.param_sync_func is not None:
            param_sync_microbatch_id = microbatch_id + pipeline_parallel_rank
            if param_sync_microbatch_id < total_num_microbatches and is_first_microbatch_for_model_chunk(
                param_sync_microbatch_id
            ):
                param_sync_chunk_id = get_model_chunk_id(param_sync_microbatch_id, forward=True) + 1
                if 1 < param_sync_chunk_id < num_model_chunks:
                    config.param_sync_func[param_sync_chunk_id](model[param_sync_chunk_id].parameters())

        # forward step
        if is_pipeline_first_stage_for_chunk(model_chunk_id, num_model_chunks, use_pipeline_model_parallel_layout):
            if len(input_tensors[model_chunk_id]) == len(output_tensors[model_chunk_id]):
                input_tensors[model_chunk_id].append(None)
        if use_pipeline_model_parallel_layout:
            offset = num_released_microbatches(microbatch_id, model_chunk_id)
            input_tensor = input_tensors[model_chunk_id][current_microbatch - offset]
        else:
            input_tensor = input_tensors[model_chunk_id][-1]

        output_tensor, num_tokens = forward_step(
            forward_step_func,
            data_iterator[model_chunk_id],
            model[model_chunk_id],
            num_microbatches,
            input_tensor,
            forward_data_store,
            config,
            collect_non_loss_data,
            checkpoint_activations_microbatch,
            check_first_val_step(
                first_val_step,
                forward_only,
                is_first_microbatch_for_model_chunk(microbatch_id),
            ),
            current_microbatch=current_microbatch,
            extra_block_kwargs=extra_block_kwargs,
        )

        if isinstance(output_tensor, tuple):
            if len(output_tensor) == 2:
                output_tensor_, model_graph = output_tensor
            elif len(output_tensor) == 3:
                output_tensor_, model_graph, pp_comm_output = output_tensor

            if is_pipeline_last_stage_for_chunk(model_chunk_id, num_model_chunks, use_pipeline_model_parallel_layout):
                if getattr(config, 'enable_mhc', False):
                    logits_inputs.append(model_graph[-1].mlp_mhc_post_graph[1])
                else:
                    logits_inputs.append(model_graph[-1].unperm2_graph[1])
            model_graphs[model_chunk_id].append(model_graph)
        else:
            output_tensor_ = output_tensor
        output_tensors[model_chunk_id].append(output_tensor_)

        if backward_k is not None:
            backward_chunk_id = get_model_chunk_id(backward_k, forward=False)
            input_tensors[backward_chunk_id].pop(0)
            output_tensors[backward_chunk_id].pop(0)
            output_tensor_grads[backward_chunk_id].pop(0)

        nonlocal total_num_tokens
        total_num_tokens += num_tokens.item()

        # if forward-only, no need to save tensors for a backward pass
        if forward_only:
            input_tensors[model_chunk_id].pop()
            output_tensors[model_chunk_id].pop()

        return output_tensor

    def backward_step_helper(microbatch_id, logits_bwd=False):
        """Helper method to run backward step with model split into chunks
        (run set_virtual_pipeline_model_parallel_rank() before calling
        backward_step()).
        """
        model_chunk_id = get_model_chunk_id(microbatch_id, forward=False)
        parallel_state.set_virtual_pipeline_model_parallel_rank(model_chunk_id)

        # launch grad synchronization (default)
        if config.grad_sync_func is None and is_last_microbatch_for_model_chunk(microbatch_id):
            enable_grad_sync()
            synchronized_model_chunks.add(model_chunk_id)

        if is_pipeline_last_stage_for_chunk(model_chunk_id, num_model_chunks, use_pipeline_model_parallel_layout):
            if len(output_tensor_grads[model_chunk_id]) == 0:
                output_tensor_grads[model_chunk_id].append(None)

        if not logits_bwd:
            input_tensor = input_tensors[model_chunk_id].pop(0)

            output_tensor = output_tensors[model_chunk_id].pop(0)
            output_tensor_grad = output_tensor_grads[model_chunk_id].pop(0)
            model_graph = model_graphs[model_chunk_id].pop(0)
        else:
            input_tensor = logits_inputs.pop(0)
            output_tensor = output_tensors[model_chunk_id][0]
            output_tensor_grad = output_tensor_grads[model_chunk_id][0]
            model_graph = None

        input_tensor_grad = backward_step(
            input_tensor, output_tensor, output_tensor_grad, model_type, config, model_graph
        )
        # launch grad synchronization (custom grad sync)
        # Note: Asynchronous communication tends to slow down compute.
        # To reduce idling from mismatched microbatch times, we launch
        # asynchronous communication at the same time across the
        # pipeline-parallel group.
        if config.grad_sync_func is not None:
            grad_sync_microbatch_id = microbatch_id - pipeline_parallel_rank
            if grad_sync_microbatch_id >= 0 and is_last_microbatch_for_model_chunk(grad_sync_microbatch_id):
                grad_sync_chunk_id = get_model_chunk_id(grad_sync_microbatch_id, forward=False)
                enable_grad_sync()
                config.grad_sync_func[grad_sync_chunk_id](model[grad_sync_chunk_id].parameters())
                synchronized_model_chunks.add(grad_sync_chunk_id)
        disable_grad_sync()

        return input_tensor_grad

    def check_pipeline_stage(forward_k, backward_k):
        if use_pipeline_model_parallel_layout:
            forward_model_chunk_id = get_model_chunk_id(forward_k, forward=True)
            backward_model_chunk_id = get_model_chunk_id(backward_k, forward=False)
            send_next = not is_pipeline_last_stage_for_chunk(forward_model_chunk_id, num_model_chunks, True)
            send_prev = not is_pipeline_first_stage_for_chunk(backward_model_chunk_id, num_model_chunks, True)
            recv_prev, _ = recv_tensor_from_previous_stage(forward_k, forward=True)
            if forward_k + 1 >= total_num_microbatches:
                recv_prev = False
            recv_next, _ = recv_tensor_from_previous_stage(backward_k, forward=False)

            return P2PCommParams(send_next=send_next, recv_prev=recv_prev), P2PCommParams(
                send_prev=send_prev, recv_next=recv_next
            )

        send_next = not (
            get_model_chunk_id(forward_k, forward=True) == num_model_chunks - 1
            and pipeline_parallel_rank == parallel_state.get_pipeline_model_parallel_world_size() - 1
        )
        send_prev = not (get_model_chunk_id(backward_k, forward=False) == 0 and pipeline_parallel_rank == 0)
        recv_prev = not (get_model_chunk_id(forward_k + 1, forward=True) == 0 and pipeline_parallel_rank == 0)
        if forward_k + 1 >= total_num_microbatches:
            recv_prev = False
        recv_next = not (
            get_model_chunk_id(backward_k + 1, forward=False) == num_model_chunks - 1
            and pipeline_parallel_rank == parallel_state.get_pipeline_model_parallel_world_size() - 1
        )

        return P2PCommParams(send_next=send_next, recv_prev=recv_prev), P2PCommParams(
            send_prev=send_prev, recv_next=recv_next
        )

    # Run warmup forward passes.
    parallel_state.set_virtual_pipeline_model_parallel_rank(0)
    input_tensors[0].append(p2p_communication.recv_forward(tensor_shape, config))

    fwd_wait_handles = None
    bwd_wait_handles = None
    P2PCommParams.tensor_shape = tensor_shape
    P2PCommParams.config = config
    for k in range(num_warmup_microbatches):
        if fwd_wait_handles is not None:
            for req in fwd_wait_handles.values():
                req.wait()

        cur_model_chunk_id = get_model_chunk_id(k, forward=True)
        # Decide to checkpoint all layers' activations of the current micro-batch
        if max_outstanding_backprops is not None:
            checkpoint_activations_microbatch = (
                k % max_outstanding_backprops >= config.num_microbatches_with_partial_activation_checkpoints
            )
        else:
            checkpoint_activations_microbatch = None

        current_microbatch = get_microbatch_id_in_model_chunk(k, forward=True)
        output_tensor = forward_step_helper(k, current_microbatch, checkpoint_activations_microbatch, backward_k=None)
        if isinstance(output_tensor, tuple):
            # use pp overlaping,
            if len(output_tensor) == 2:
                output_tensor, model_graph = output_tensor
            elif len(output_tensor) == 3:
                output_tensor, model_graph, pp_comm_output = output_tensor

        # Determine if tensor should be received from previous stage.
        if use_pipeline_model_parallel_layout:
            recv_prev, next_forward_model_chunk_id = recv_tensor_from_previous_stage(k, forward=True)
        else:
            next_forward_model_chunk_id = get_model_chunk_id(k + 1, forward=True)
            recv_prev = True
            if parallel_state.is_pipeline_first_stage(ignore_virtual=True):
                if next_forward_model_chunk_id == 0:
                    recv_prev = False
        if k == (total_num_microbatches - 1):
            recv_prev = False

        # Don't send tensor downstream if on last stage.
        if is_pipeline_last_stage_for_chunk(cur_model_chunk_id, num_model_chunks, use_pipeline_model_parallel_layout):
            output_tensor = None

        # Send and receive tensors as appropriate (send tensors computed
        # in this iteration; receive tensors for next iteration).
        if not config.overlap_p2p_comm:
            if isinstance(output_tensor, tuple):
                if len(output_tensor) == 2:
                    output_tensor, model_graph = output_tensor
                elif len(output_tensor) == 3:
                    output_tensor, model_graph, pp_comm_output = output_tensor
            if not use_pipeline_model_parallel_layout and parallel_state.is_pipeline_last_stage():
                model_graph, logits_input = model_graph
                logits_input.append(logits_input)
            if k == (num_warmup_microbatches - 1) and not forward_only and not all_warmup_microbatches:
                input_tensor_grad = None
                recv_next = True

                if parallel_state.is_pipeline_last_stage(ignore_virtual=True):
                    recv_next = False
                (
                    input_tensor,
                    output_tensor_grad,
                ) = p2p_communication.send_forward_backward_recv_forward_backward(
                    output_tensor,
                    input_tensor_grad,
                    recv_prev=recv_prev,
                    recv_next=recv_next,
                    tensor_shape=tensor_shape,
                    config=config,
                )
                output_tensor_grads[num_model_chunks - 1].append(output_tensor_grad)
            else:
                input_tensor = p2p_communication.send_forward_recv_forward(
                    output_tensor, recv_prev=recv_prev, tensor_shape=tensor_shape, config=config
                )
            if (not use_pipeline_model_parallel_layout) or recv_prev:
                input_tensors[next_forward_model_chunk_id].append(input_tensor)
        else:
            input_tensor, fwd_wait_handles = p2p_communication.send_forward_recv_forward(
                output_tensor,
                recv_prev=recv_prev,
                tensor_shape=tensor_shape,
                config=config,
                overlap_p2p_comm=True,
            )

            if k == (num_warmup_microbatches - 1) and not forward_only and not all_warmup_microbatches:
                input_tensor_grad = None
                recv_next = True
                if parallel_state.is_pipeline_last_stage(ignore_virtual=True):
                    recv_next = False

                (
                    output_tensor_grad,
                    bwd_wait_handles,
                ) = p2p_communication.send_backward_recv_backward(
                    input_tensor_grad,
                    recv_next=recv_next,
                    tensor_shape=tensor_shape,
                    config=config,
                    overlap_p2p_comm=True,
                )

                output_tensor_grads[num_model_chunks - 1].append(output_tensor_grad)
            if (not use_pipeline_model_parallel_layout) or recv_prev:
                input_tensors[next_forward_model_chunk_id].append(input_tensor)

        deallocate_output_tensor(output_tensor, config.deallocate_pipeline_outputs)
    # Run 1F1B in steady state.
    for k in range(num_microbatches_remaining):
        # Forward pass.

        forward_k = k + num_warmup_microbatches

        # Decide to checkpoint all layers' activations of the current micro-batch
        if max_outstanding_backprops is not None:
            checkpoint_activations_microbatch = (
                forward_k % max_outstanding_backprops >= config.num_microbatches_with_partial_activation_checkpoints
            )
        else:
            checkpoint_activations_microbatch = None

        #  按照绝对mbid 判断chunk无需修改
        cur_model_chunk_id = get_model_chunk_id(forward_k, forward=True)
        current_microbatch = get_microbatch_id_in_model_chunk(forward_k, forward=True)

        if config.overlap_p2p_comm:
            if fwd_wait_handles is not None:
                for req in fwd_wait_handles.values():
                    req.wait()
            if bwd_wait_handles is not None:
                for req in bwd_wait_handles.values():
                    req.wait()
            deallocate_output_tensor(output_tensor, config.deallocate_pipeline_outputs)

            extra_block_kwargs = {}
            backward_k = k
            backward_model_chunk_id = get_model_chunk_id(backward_k, forward=False)
            parallel_state.set_virtual_pipeline_model_parallel_rank(backward_model_chunk_id)

            if is_pipeline_last_stage_for_chunk(
                backward_model_chunk_id, num_model_chunks, use_pipeline_model_parallel_layout
            ):
                input_tensor_grad = backward_step_helper(backward_k, logits_bwd=True)
                assert input_tensor_grad is not None, "logits backward should not be None"
                extra_block_kwargs.setdefault('bwd_block_output_grad', input_tensor_grad)

            else:
                # input_tensor_grad通过pp通信获得
                output_tensor_grad = output_tensor_grads[backward_model_chunk_id][0]
                extra_block_kwargs.setdefault('bwd_block_output_grad', output_tensor_grad)

            fwd_pp_comm_params, bwd_pp_comm_params = check_pipeline_stage(forward_k, backward_k)

            extra_block_kwargs.setdefault('bwd_block_graphs', model_graphs[backward_model_chunk_id].pop(0))
            extra_block_kwargs.setdefault('pp_comm_params', fwd_pp_comm_params)
            extra_block_kwargs.setdefault('bwd_pp_comm_params', bwd_pp_comm_params)

            output_tensor = forward_step_helper(
                forward_k,
                current_microbatch,
                checkpoint_activations_microbatch,
                extra_block_kwargs,
                backward_k=backward_k,
            )

            output_tensor, model_graph, pp_comm_output = output_tensor
            input_tensor, fwd_wait_handles = pp_comm_output.input_tensor, pp_comm_output.fwd_wait_handles
            output_tensor_grad, bwd_wait_handles = pp_comm_output.output_tensor_grad, pp_comm_output.bwd_wait_handles

            if fwd_pp_comm_params.recv_prev:
                if use_pipeline_model_parallel_layout:
                    _, next_forward_model_chunk_id = recv_tensor_from_previous_stage(forward_k, forward=True)
                else:
                    next_forward_model_chunk_id = get_model_chunk_id(forward_k + 1, forward=True)
                input_tensors[next_forward_model_chunk_id].append(input_tensor)

            if bwd_pp_comm_params.recv_next:
                if use_pipeline_model_parallel_layout:
                    _, next_backward_model_chunk_id = recv_tensor_from_previous_stage(backward_k, forward=False)
                else:
                    next_backward_model_chunk_id = get_model_chunk_id(backward_k + 1, forward=False)
                output_tensor_grads[next_backward_model_chunk_id].append(output_tensor_grad)

            if is_pipeline_last_stage_for_chunk(
                cur_model_chunk_id, num_model_chunks, use_pipeline_model_parallel_layout
            ):
                output_tensor = None

    deallocate_output_tensor(output_tensor, config.deallocate_pipeline_outputs)

    # Run cooldown backward passes (flush out pipeline).
    if not forward_only:
        if config.overlap_p2p_comm and bwd_wait_handles is not None:
            for wait_handle in bwd_wait_handles.values():
                wait_handle.wait()

        if all_warmup_microbatches:
            output_tensor_grads[num_model_chunks - 1].append(
                p2p_communication.recv_backward(tensor_shape, config=config)
            )
        for k in range(num_microbatches_remaining, total_num_microbatches):
            chunk_id = get_model_chunk_id(k, False)
            parallel_state.set_virtual_pipeline_model_parallel_rank(chunk_id)

            if is_pipeline_last_stage_for_chunk(chunk_id, num_model_chunks, use_pipeline_model_parallel_layout):
                input_tensor_grad = backward_step_helper(k, logits_bwd=True)

                output_tensor_grads[chunk_id].append(input_tensor_grad)
                output_tensors[chunk_id].pop(0)
                output_tensors[chunk_id].append(None)  # dummy output tensors
            input_tensor_grad = backward_step_helper(k)

            if use_pipeline_model_parallel_layout:
                recv_next, next_backward_model_chunk_id = recv_tensor_from_previous_stage(k, forward=False)
            else:
                next_backward_model_chunk_id = get_model_chunk_id(k + 1, forward=False)
                recv_next = True
                if parallel_state.is_pipeline_last_stage(ignore_virtual=True):
                    if next_backward_model_chunk_id == (num_model_chunks - 1):
                        recv_next = False
            if k == (total_num_microbatches - 1):
                recv_next = False

            output_tensor_grad = p2p_communication.send_backward_recv_backward(
                input_tensor_grad, recv_next=recv_next, tensor_shape=tensor_shape, config=config
            )
            if (not use_pipeline_model_parallel_layout) or recv_next:
                output_tensor_grads[next_backward_model_chunk_id].append(output_tensor_grad)

        # Launch any remaining grad reductions.
        enable_grad_sync()
        if config.grad_sync_func is not None:
            for model_chunk_id in range(num_model_chunks):
                if model_chunk_id not in synchronized_model_chunks:
                    config.grad_sync_func[model_chunk_id](model[model_chunk_id].parameters())
                    synchronized_model_chunks.add(model_chunk_id)

    if config.finalize_model_grads_func is not None and not forward_only:
        # If defer_embedding_wgrad_compute is enabled we need to do the
        # weight gradient GEMM's here.
        finish_embedding_wgrad_compute(config, embedding_module)

        # Finalize model grads (perform full grad all-reduce / reduce-scatter for
        # data parallelism, layernorm all-reduce for sequence parallelism, and
        # embedding all-reduce for pipeline parallelism).
        config.finalize_model_grads_func(model, total_num_tokens if config.calculate_per_token_loss else None)

    if config.timers is not None:
        config.timers('forward-backward').stop()

    return forward_data_store
