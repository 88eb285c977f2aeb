"""``cpu.megatron.distrib-optimizer-torch-adam-state``: the distributed optimizer's checkpointing with torch's
AdamW (Megatron's Adam without Apex or Transformer Engine), whose per-parameter state holds a ``step``
and is created lazily, on the first step."""

from __future__ import annotations

import torch

from mcore_dapo.patching.patcher import Patcher
from mcore_dapo.patching.registry import implements

MODULE = "megatron.core.optimizer.distrib_optimizer"


_SCALAR = {True: torch.float64, False: torch.float32}  # torch.optim's _get_scalar_dtype()


def _torch_adamw(optimizer) -> bool:
    return isinstance(optimizer, torch.optim.AdamW)


def _initialised_state(original):
    def state_dict(self, *args, **kwargs):
        # Before the first step (a resume), torch's AdamW has no state yet and Megatron's state_dict reads the
        # step from it: create it as AdamW's first step would (_init_group: step 0, zero moments).
        if _torch_adamw(self.optimizer):
            for group in self.optimizer.param_groups:
                for p in group["params"]:
                    state = self.optimizer.state[p]
                    if len(state) == 0:
                        state["step"] = torch.tensor(0.0, dtype=_SCALAR[torch.get_default_dtype() == torch.float64])
                        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                        if group.get("amsgrad"):
                            state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return original(self, *args, **kwargs)

    return state_dict


def _keeps_step(original):
    def _set_main_param_and_optimizer_states(self, model_param, tensors):
        if not _torch_adamw(self.optimizer):
            return original(self, model_param, tensors)
        # The step is Megatron's to restore from the parameter groups (load_state_dict did): never a checkpoint
        # tensor's (fully_sharded_model_space drops it, dp_reshardable carries this process's own as a
        # non-persistent placeholder)
        tensors = {k: v for k, v in tensors.items() if k != "step"}
        group_index, group_order = self.model_param_group_index_map[model_param]
        main_param = self.optimizer.param_groups[group_index]["params"][group_order]
        state = self.optimizer.state.get(main_param, {})
        step = state.pop("step", None)
        try:
            return original(self, model_param, tensors)
        finally:
            if step is not None:
                # load_state_dict gives every parameter the same step tensor ("Extract 'step', for non-Apex/TE
                # support"), and torch's AdamW adds 1 to each parameter's step in place: shared, the first step
                # after a resume would advance it once per parameter (Adam's bias correction off)
                state["step"] = step.clone()

    return _set_main_param_and_optimizer_states


@implements("cpu.megatron.distrib-optimizer-torch-adam-state")
def _distrib_optimizer_torch_adam_state(patch: Patcher) -> None:
    patch.wrap(_initialised_state, f"{MODULE}:DistributedOptimizer.state_dict")
    patch.wrap(_keeps_step, f"{MODULE}:DistributedOptimizer._set_main_param_and_optimizer_states")
