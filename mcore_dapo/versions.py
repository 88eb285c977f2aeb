"""The versions of torch, megatron-core and verl this project supports, and the one-line refusal outside them.

Two lines are tested on the CPU (``make test`` and ``make test STACK=ascend``):

* the main line: torch 2.13.0, megatron-core 0.16.1 (requirements/lock.txt);
* the Ascend line: torch 2.7.1, megatron-core 0.12.1, what every maintained MindSpeed branch
  (``*_core_r0.12.1``) and verl's Ascend quick start pin (requirements/lock-ascend.txt).

torch and megatron-core are checked as a pair (:data:`PAIRS`): each package inside its range is not
enough (torch 2.13 with megatron-core 0.12.1 fails in Megatron's dist-ckpt writer), so a stack runs only
on a pair of release lines that has been tested, patch releases of the tested ones included. Every
difference between the lines that this project meets is decided by a version gate
(patches/manifest.toml) or by asking Megatron what it has.

This module imports nothing else of the project and has no side effects: asking for a version imports
no verl and registers nothing (tests/test_versions.py).
"""

from __future__ import annotations

import importlib.metadata as md
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import Version

SUPPORTED = {  # the software stack under Megatron: recorded in every checkpoint's manifest (written_by)
    "torch": ">=2.7.1,<2.14",
    "megatron-core": ">=0.12.1,<0.17",
}
SUPPORTED_VERL = ">=0.9.1,<0.10"  # a version specifier set; patches/manifest.toml's verl entries agree
TESTED = {
    "main": {"torch": "2.13.0", "megatron-core": "0.16.1"},
    "ascend": {"torch": "2.7.1", "megatron-core": "0.12.1"},
}
TESTED_VERL = "0.9.1"


@dataclass(frozen=True)
class StackPair:
    """A tested torch x megatron-core pair; a stack matches it on the same release lines (major.minor),
    at or after the tested patch releases."""

    torch: str
    megatron_core: str
    tested_by: str

    def matches(self, torch: str, megatron_core: str) -> bool:
        return _same_line_at_least(torch, self.torch) and _same_line_at_least(megatron_core, self.megatron_core)

    def __str__(self) -> str:
        return f"torch {self.torch} with megatron-core {self.megatron_core}"


PAIRS = (
    StackPair(TESTED["main"]["torch"], TESTED["main"]["megatron-core"], "make test (requirements/lock.txt)"),
    StackPair("2.11.0", "0.16.1", "tools/cuda_check.sh on one H200: Megatron against HF (docs/BENCHMARKS.md)"),
    StackPair(TESTED["ascend"]["torch"], TESTED["ascend"]["megatron-core"],
              "make test STACK=ascend (requirements/lock-ascend.txt)"),
)


def installed(package: str) -> str | None:
    try:
        return md.version(package)
    except md.PackageNotFoundError:
        return None


def version_in(version: str, versions: str) -> bool:
    """Whether ``version`` lies in the range ``versions`` (development builds of it included)."""
    return SpecifierSet(versions).contains(Version(version), prereleases=True)


def base_version(version: str) -> str:
    """``2.13.0+cpu`` -> ``2.13.0`` (local build labels do not change the release)."""
    return version.split("+", 1)[0]


def _release(version: str) -> tuple[int, ...]:
    return Version(base_version(version)).release


def _same_line_at_least(version: str, tested: str) -> bool:
    got, want = _release(version), _release(tested)
    return got[:2] == want[:2] and got >= want


def supported_range(package: str) -> str:
    if package == "verl":
        return SUPPORTED_VERL
    return SUPPORTED[package]


def is_supported(package: str, version: str) -> bool:
    return version_in(base_version(version), supported_range(package))


def supported_pair(torch: str, megatron_core: str) -> StackPair | None:
    """The tested pair this torch and megatron-core belong to, None for an untested pair."""
    return next((p for p in PAIRS if p.matches(torch, megatron_core)), None)


def tested_pairs() -> str:
    return ", ".join(str(p) for p in PAIRS)


def unsupported_pair(torch: str, megatron_core: str) -> str:
    """One line: an untested torch x megatron-core pair and the pairs that are tested."""
    line = ".".join(map(str, _release(torch)[:2]))
    fit = [p.megatron_core for p in PAIRS if _release(p.torch)[:2] == _release(torch)[:2]]
    hint = f"; with torch {line} install megatron-core=={fit[0]}" if fit else ""
    return (f"torch {torch} with megatron-core {megatron_core} is not a tested pair: tested are {tested_pairs()} "
            f"(later patch releases of these lines too){hint}")


def check(package: str, version: str | None = None) -> None:
    """One-line :class:`UserError` when ``package`` (installed, or ``version``) is outside its range."""
    version = version if version is not None else installed(package)
    if version is None:
        raise _user_error(f"{package} is not installed: supported is {package}{supported_range(package)}")
    if not is_supported(package, version):
        raise _user_error(f"{package} {version} is not supported: supported is {package}{supported_range(package)} "
                          f"(tested: {_tested(package)})")


def check_pair(torch: str, megatron_core: str) -> None:
    """One-line :class:`UserError` for a torch x megatron-core pair that is not tested."""
    if supported_pair(torch, megatron_core) is None:
        raise _user_error(unsupported_pair(torch, megatron_core))


def check_stack() -> None:
    """torch and megatron-core, each in its range and as a tested pair, before Megatron is used (every
    device adapter's apply_patches, every converter)."""
    for package in SUPPORTED:
        check(package)
    check_pair(installed("torch"), installed("megatron-core"))


def _tested(package: str) -> str:
    if package == "verl":
        return TESTED_VERL
    return " and ".join(t[package] for t in TESTED.values())


def _user_error(message: str) -> Exception:
    from mcore_dapo.errors import UserError  # at the refusal only: importing this module imports nothing else

    return UserError(message)


def megatron_version() -> tuple[int, int, int]:
    """megatron-core's (major, minor, micro), for code that differs between the lines."""
    v = Version(base_version(installed("megatron-core") or "0"))
    return (v.major, v.minor, v.micro)
