"""Define features of pipeline parallel training."""

from .noop_layers import NoopLayersFeature
from .pipeline_model_parallel_layout_feature import PipelineModelParallelLayoutFeature

__all__ = ["NoopLayersFeature", "PipelineModelParallelLayoutFeature"]
