"""The versions of torch, megatron-core and verl this project supports, and the one-line refusal outside them.

Two lines are tested on the CPU (``make test`` and ``make test STACK=ascend``):

* the main line: torch 2.13.0, megatron-core 0.16.1 (requirements/lock.txt);
* the Ascend line: torch 2.7.1, megatron-core 0.12.1, what every maintained MindSpeed branch
  (``*_core_r0.12.1``) and verl's Ascend quick start pin (requirements/lock-ascend.txt).

The releases in between are accepted: every difference between the two lines that this project
meets is decided by a version gate (patches/manifest.toml) or by asking Megatron what it has.
"""

from __future__ import annotations

from mcore_dapo.errors import UserError

SUPPORTED = {
    "torch": ">=2.7.1,<2.14",
    "megatron-core": ">=0.12.1,<0.17",
}
# verl's range lives with the plugin (mcore_dapo.verl_plugin.SUPPORTED_VERL); repeated here by reference
TESTED = {
    "main": {"torch": "2.13.0", "megatron-core": "0.16.1"},
    "ascend": {"torch": "2.7.1", "megatron-core": "0.12.1"},
}


def installed(package: str) -> str | None:
    from mcore_dapo.patching.registry import installed_version

    return installed_version(package)


def base_version(version: str) -> str:
    """``2.13.0+cpu`` -> ``2.13.0`` (local build labels do not change the release)."""
    return version.split("+", 1)[0]


def supported_range(package: str) -> str:
    if package == "verl":
        from mcore_dapo.verl_plugin import SUPPORTED_VERL

        return SUPPORTED_VERL
    return SUPPORTED[package]


def is_supported(package: str, version: str) -> bool:
    from mcore_dapo.patching.registry import version_in

    return version_in(base_version(version), supported_range(package))


def check(package: str, version: str | None = None) -> None:
    """One-line :class:`UserError` when ``package`` (installed, or ``version``) is outside its range."""
    version = version if version is not None else installed(package)
    if version is None:
        raise UserError(f"{package} is not installed: supported is {package}{supported_range(package)}")
    if not is_supported(package, version):
        raise UserError(f"{package} {version} is not supported: supported is {package}{supported_range(package)} "
                        f"(tested: {_tested(package)})")


def check_stack() -> None:
    """torch and megatron-core, before Megatron is used (every device adapter's apply_patches)."""
    for package in SUPPORTED:
        check(package)


def _tested(package: str) -> str:
    if package == "verl":
        return "0.9.1"
    return " and ".join(t[package] for t in TESTED.values())


def megatron_version() -> tuple[int, int, int]:
    """megatron-core's (major, minor, micro), for code that differs between the lines."""
    from packaging.version import Version

    v = Version(base_version(installed("megatron-core") or "0"))
    return (v.major, v.minor, v.micro)
