"""Tiny Qwen3-MoE-shaped models and HF reference outputs for tests, demo and benchmarks."""
