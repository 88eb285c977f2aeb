"""What the planner is asked to fit: the cluster, the DAPO batch, and the training knobs."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from mcore_dapo.errors import UserError
from mcore_dapo.plan.hardware import DeviceSpec

RECOMPUTE = ("full", "selective", "none")
OFFLOAD = ("none", "optimizer", "param", "param+optimizer")  # verl's param_offload also frees the gradients


@dataclass(frozen=True)
class Workload:
    device: DeviceSpec
    nodes: int = 1
    devices_per_node: int = 8
    # the guide's DAPO run: 2k prompt, 6k response, 32 prompts x 16 responses, 16k tokens per micro-batch
    max_prompt: int = 2048
    max_response: int = 6144
    micro_batch_tokens: int = 16384  # verl's ppo_max_token_len_per_gpu (dynamic batch size)
    prompts: int = 32  # data.train_batch_size
    responses_per_prompt: int = 16  # actor_rollout_ref.rollout.n
    gen_prompts: int = 96  # prompts generated per step (data.gen_batch_size; the guide's 3 x train_batch_size)
    mean_tokens: int | None = None  # mean prompt+response tokens per sample; None = the maxima (worst case)
    recompute: str = "full"
    offload: str = "none"
    gpu_memory_utilization: float = 0.5  # vLLM's share of the device during rollout (verl's default)
    efficiency: float = 0.25  # achieved fraction of the peak matmul rate
    grad_bytes: int = 4  # Megatron's gradient buffer in fp32 for bf16 training
    # the rollout's per-decode-step overhead beyond the bytes read, (eager, graph) in ms, measured on the device
    # (docs/PLANNER.md, "Generation"); None: the planner's guess from published figures
    step_overhead_ms: tuple[float, float] | None = None

    def __post_init__(self):
        if self.recompute not in RECOMPUTE:
            raise UserError(f"recompute={self.recompute!r} is not accepted: accepted are {', '.join(RECOMPUTE)}")
        if self.offload not in OFFLOAD:
            raise UserError(f"offload={self.offload!r} is not accepted: accepted are {', '.join(OFFLOAD)}")
        if not 0.0 <= self.gpu_memory_utilization < 1.0:
            raise UserError(
                f"gpu_memory_utilization={self.gpu_memory_utilization} is not accepted: a fraction in [0, 1) is"
            )
        if not 0.0 < self.efficiency <= 1.0:
            raise UserError(f"efficiency={self.efficiency} is not accepted: a fraction in (0, 1] is")
        for name in ("nodes", "devices_per_node", "max_prompt", "max_response", "micro_batch_tokens",
                     "prompts", "responses_per_prompt", "gen_prompts"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise UserError(f"{name}={v!r} is not accepted: a positive integer is")
        if self.step_overhead_ms is not None and (
                len(self.step_overhead_ms) != 2 or any(not 0.0 <= float(v) < 1000.0 for v in self.step_overhead_ms)):
            raise UserError(f"step_overhead_ms={self.step_overhead_ms!r} is not accepted: two times in ms, eager then "
                            "graph, each in [0, 1000) are")
        if self.micro_batch_tokens < self.max_prompt + self.max_response:
            raise UserError(
                f"micro_batch_tokens={self.micro_batch_tokens} is not accepted: it must hold one whole sample, "
                f"at least max_prompt + max_response = {self.max_prompt + self.max_response}"
            )

    @property
    def world_size(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def sample_tokens(self) -> int:
        return self.mean_tokens or (self.max_prompt + self.max_response)

    @property
    def step_tokens(self) -> int:
        """Tokens the actor trains on per step (all samples of the batch)."""
        return self.prompts * self.responses_per_prompt * self.sample_tokens

    def as_dict(self) -> dict:
        d = asdict(self)
        d["device"] = self.device.name
        d["world_size"] = self.world_size
        return d
