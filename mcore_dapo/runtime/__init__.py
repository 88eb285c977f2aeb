"""Megatron runtime: parallel state, model building from the bridge, HF weight loading, forward passes."""
