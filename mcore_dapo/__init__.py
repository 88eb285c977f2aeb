"""mcore-dapo: verl DAPO training of Qwen3-MoE on Megatron-core (Ascend, NVIDIA, CPU)."""

__version__ = "0.1.0"
