"""The one place where patches of other packages are registered, applied, reported and undone.

The manifest (``patches/manifest.toml``) says what each patch targets, for which
versions and why; the implementation registers under the same id with
:func:`implements`. A patch is applied only when its package is installed at a
version inside the manifest's range; :func:`report` says, for every patch,
whether it applies on this machine and why not.
"""

from __future__ import annotations

import importlib.metadata as md
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from packaging.specifiers import SpecifierSet
from packaging.version import Version

Undo = Callable[[], None]


@dataclass(frozen=True)
class PatchSpec:
    id: str
    package: str
    versions: str
    target: str
    kind: str
    devices: tuple[str, ...]
    reason: str
    file: str | None = None


@dataclass
class PatchStatus:
    id: str
    package: str
    versions: str
    installed: str | None
    applies: bool
    applied: bool = False
    why_not: str | None = None


def manifest_path() -> Path:
    here = Path(__file__).resolve().parent.parent
    for p in (here / "_patches" / "manifest.toml", here.parent / "patches" / "manifest.toml"):
        if p.is_file():
            return p
    raise FileNotFoundError("patches/manifest.toml is missing from the installation")


def load_manifest(path: Path | None = None) -> dict[str, PatchSpec]:
    data = tomllib.loads((path or manifest_path()).read_text())
    specs = {}
    for entry in data.get("patch", []):
        spec = PatchSpec(
            id=entry["id"],
            package=entry["package"],
            versions=entry["versions"],
            target=entry["target"],
            kind=entry["kind"],
            devices=tuple(entry["devices"]),
            reason=" ".join(entry["reason"].split()),
            file=entry.get("file"),
        )
        if spec.kind not in ("replace", "wrap"):
            raise ValueError(f"patch {spec.id}: kind must be 'replace' or 'wrap', not {spec.kind!r}")
        if spec.id in specs:
            raise ValueError(f"patch {spec.id} is listed twice in the manifest")
        specs[spec.id] = spec
    return specs


_IMPLS: dict[str, Callable[[], Undo]] = {}
_APPLIED: dict[str, Undo] = {}


def implements(patch_id: str):
    """Register the function that applies ``patch_id`` and returns its undo."""

    def deco(fn: Callable[[], Undo]):
        if patch_id in _IMPLS and _IMPLS[patch_id] is not fn:
            raise ValueError(f"patch {patch_id} has two implementations")
        _IMPLS[patch_id] = fn
        return fn

    return deco


def installed_version(package: str) -> str | None:
    try:
        return md.version(package)
    except md.PackageNotFoundError:
        return None


def status(device: str, specs: dict[str, PatchSpec] | None = None) -> list[PatchStatus]:
    out = []
    for spec in (specs or load_manifest()).values():
        if device not in spec.devices:
            continue
        v = installed_version(spec.package)
        st = PatchStatus(spec.id, spec.package, spec.versions, v, applies=False, applied=spec.id in _APPLIED)
        if v is None:
            st.why_not = f"{spec.package} is not installed"
        elif Version(v) not in SpecifierSet(spec.versions):
            st.why_not = f"{spec.package} {v} is outside {spec.versions}"
        elif spec.id not in _IMPLS:
            st.why_not = "no implementation registered"
        else:
            st.applies = True
        out.append(st)
    return out


def apply(device: str) -> list[PatchStatus]:
    """Apply every patch for ``device`` whose version range matches; idempotent."""
    result = status(device)
    for st in result:
        if st.applies and st.id not in _APPLIED:
            _APPLIED[st.id] = _IMPLS[st.id]()
            st.applied = True
    return result


def remove_all() -> None:
    """Undo every applied patch, newest first."""
    for pid in reversed(list(_APPLIED)):
        _APPLIED.pop(pid)()


def applied_ids() -> list[str]:
    return list(_APPLIED)


def implemented_ids() -> set[str]:
    return set(_IMPLS)


def chain(*undos: Undo) -> Undo:
    """One undo for several, run in reverse order."""

    def undo():
        for u in reversed(undos):
            u()

    return undo


def swap(obj, attr: str, new) -> Undo:
    """Set ``obj.attr = new``; the returned undo puts the original back."""
    missing = object()
    old = getattr(obj, attr, missing)
    setattr(obj, attr, new)

    def undo():
        if old is missing:
            delattr(obj, attr)
        else:
            setattr(obj, attr, old)

    return undo
