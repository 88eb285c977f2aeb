"""Run metrics from verl console logs: parsing, the guide's throughputs, summaries, comparison, plots.

``parse`` (lines, files, Ray session folders) -> ``throughput`` (e2e/update/vLLM tokens per device
and second, medians) -> ``compare`` (ratio tables) and ``plot`` (PNG) -> ``report`` (text).
"""

from mcore_dapo.metrics.parse import RunLog, parse_line, read_run
from mcore_dapo.metrics.throughput import Batch, summarise, with_throughputs

__all__ = ["RunLog", "parse_line", "read_run", "Batch", "summarise", "with_throughputs"]
