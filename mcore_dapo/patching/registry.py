"""The one place where patches of other packages are registered, applied, reported and undone.

The manifest (``patches/manifest.toml``) says what each patch targets, for which
versions and why; the implementation registers under the same id with
:func:`implements`. A patch is applied only when its package is installed at a
version inside the manifest's range; :func:`status` says, for every patch,
whether it applies on this machine and why not.

An implementation changes other packages only through the :class:`~.patcher.Patcher` it is
handed, which holds it to its manifest entry (declared targets only; a ``wrap`` calls the original,
a ``replace`` never sees it). No object is the target of two patches: :func:`load_manifest`
refuses overlapping targets.
"""

from __future__ import annotations

import importlib.metadata as md
import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Callable

from mcore_dapo import versions
from mcore_dapo.patching.patcher import Patcher

try:
    import tomllib  # novermin: Python 3.10 takes the tomli fallback below
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

TARGET = re.compile(r"^[\w.*]+:[\w.*]+$")  # module:attribute[.attribute], `*` in patterns only


@dataclass(frozen=True)
class PatchSpec:
    id: str
    package: str
    versions: str
    target: tuple[str, ...]
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


def _spec(entry: dict) -> PatchSpec:
    if not isinstance(entry["target"], list):
        raise ValueError(f"patch {entry['id']}: target must be a list of 'module:attribute' names")
    spec = PatchSpec(
        id=entry["id"],
        package=entry["package"],
        versions=entry["versions"],
        target=tuple(entry["target"]),
        kind=entry["kind"],
        devices=tuple(entry["devices"]),
        reason=" ".join(entry["reason"].split()),
        file=entry.get("file"),
    )
    if spec.kind not in ("replace", "wrap"):
        raise ValueError(f"patch {spec.id}: kind must be 'replace' or 'wrap', not {spec.kind!r}")
    bad = [t for t in spec.target if not TARGET.match(t)]
    if bad or not spec.target:
        raise ValueError(f"patch {spec.id}: target must list 'module:attribute' names, got {bad or '[]'}")
    return spec


def _overlap(a: str, b: str) -> bool:
    return fnmatchcase(a, b) or fnmatchcase(b, a)


def _refuse_overlaps(specs: list[PatchSpec]) -> None:
    owned: list[tuple[str, str]] = []
    for spec in specs:
        for t in spec.target:
            for other_id, other in owned:
                if _overlap(t, other):
                    names = t if t == other else f"{other} and {t}"
                    raise ValueError(f"patches {other_id} and {spec.id} both target {names}: "
                                     "an object is patched by one manifest entry only")
            owned.append((spec.id, t))


def load_manifest(path: Path | None = None) -> dict[str, PatchSpec]:
    data = tomllib.loads((path or manifest_path()).read_text())
    specs: dict[str, PatchSpec] = {}
    for entry in data.get("patch", []):
        spec = _spec(entry)
        if spec.id in specs:
            raise ValueError(f"patch {spec.id} is listed twice in the manifest")
        specs[spec.id] = spec
    _refuse_overlaps(list(specs.values()))
    return specs


version_in = versions.version_in  # one rule for a version in a range, the patches' and the stack's


# --------------------------------------------------------------------------------------
# Registration, status, application
# --------------------------------------------------------------------------------------

_IMPLS: dict[str, Callable[[Patcher], None]] = {}
_APPLIED: dict[str, Patcher] = {}


def implements(patch_id: str):
    """Register the function that applies ``patch_id`` through the :class:`Patcher` it is handed."""

    def deco(fn: Callable[[Patcher], None]):
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
    for spec in (load_manifest() if specs is None else specs).values():
        if device not in spec.devices:
            continue
        v = installed_version(spec.package)
        st = PatchStatus(spec.id, spec.package, spec.versions, v, applies=False, applied=spec.id in _APPLIED)
        if v is None:
            st.why_not = f"{spec.package} is not installed"
        elif not version_in(v, spec.versions):
            st.why_not = f"{spec.package} {v} is outside {spec.versions}"
        elif spec.id not in _IMPLS:
            st.why_not = "no implementation registered"
        else:
            st.applies = True
        out.append(st)
    return out


def apply(device: str, package: str | None = None) -> list[PatchStatus]:
    """Apply every patch for ``device`` (of ``package`` only, if given) whose version range matches;
    idempotent. A patch that fails half-way is undone before the error propagates."""
    specs = {k: s for k, s in load_manifest().items() if package in (None, s.package)}
    result = status(device, specs)
    for st in result:
        if st.applies and st.id not in _APPLIED:
            patcher = Patcher(specs[st.id])
            try:
                _IMPLS[st.id](patcher)
            except BaseException:
                patcher.undo()
                raise
            _APPLIED[st.id] = patcher
            st.applied = True
    return result


def remove_all() -> None:
    """Undo every applied patch, newest first."""
    for pid in reversed(list(_APPLIED)):
        _APPLIED.pop(pid).undo()


def applied_ids() -> list[str]:
    return list(_APPLIED)


def implemented_ids() -> set[str]:
    return set(_IMPLS)
