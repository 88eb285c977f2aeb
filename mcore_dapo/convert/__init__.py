"""Checkpoint conversion: HF safetensors <-> Megatron torch_dist, for any TP/PP/EP/ETP layout."""
