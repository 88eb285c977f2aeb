"""Where the project's files outside the Python code are: the launch scripts and the model's config.

In a checkout they are ``configs/`` beside the package; in a wheel, ``mcore_dapo/_configs`` (pyproject.toml's
force-include, like ``patches/`` -> ``mcore_dapo/_patches``). Every reader asks here, so a wheel installed
anywhere runs the same commands as the checkout. Imports nothing else of the project.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS = {"qwen3-30b-a3b": "Qwen3-30B-A3B (128 experts, top-8): the guide's model"}


def configs_dir() -> Path:
    """The launch scripts' folder: the wheel's copy, else the checkout's (its readers name a missing file in one
    line)."""
    for p in (HERE / "_configs", HERE.parent / "configs"):
        if (p / "dapo" / "common.sh").is_file():
            return p
    return HERE / "_configs"


def common_script() -> Path:
    return configs_dir() / "dapo" / "common.sh"


def device_script(device: str) -> Path:
    """``dapo_qwen3_30b_<device>.sh`` (device: a2, h100)."""
    return configs_dir() / f"dapo_qwen3_30b_{device}.sh"


def model_config(name: str = "qwen3-30b-a3b") -> Path:
    """The folder holding a shipped model's config.json."""
    return configs_dir() / "models" / name


def model_path(arg: str) -> str:
    """``arg`` when it is a path on this machine; a shipped model's name (``qwen3-30b-a3b``) is its config's folder."""
    if not Path(arg).exists() and arg.lower() in MODELS:
        return str(model_config(arg.lower()))
    return arg
