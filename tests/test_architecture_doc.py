"""docs/ARCHITECTURE.md's tree names every module of the package, and names no module that is not there.

The tree is the first code block under ``mcore_dapo/``: a package is an entry ``name/`` (its entries two
columns further in), a module ``name.py`` in an entry or in the text of its package's entries; a path
``pkg/name.py`` whose first part is one of the package's folders names that module (other paths, such as
``megatron/core/fp8_utils.py``, are other projects' files). No Megatron, no process: text and files only.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mcore_dapo"
DOC = ROOT / "docs" / "ARCHITECTURE.md"
MODULE = re.compile(r"(?<![\w./-])((?:[A-Za-z_]\w*/)*[A-Za-z_]\w*)\.py\b")
FOLDERS = re.compile(r"^((?:[A-Za-z_]\w*/,?\s*)+)(?:\s{2,}|$)")


def _tree() -> list[str]:
    text = DOC.read_text()
    start = text.index("```\nmcore_dapo/\n") + len("```\nmcore_dapo/\n")
    lines = []
    for line in text[start:].splitlines():
        if not line.startswith(" "):  # patches/manifest.toml, configs/, tools/: outside the package
            break
        lines.append(line)
    return lines


def named_in_doc() -> tuple[set[str], set[str]]:
    """(modules, packages) the tree names, as paths relative to mcore_dapo/ (``bridge/layout.py``, ``bridge``)."""
    top_folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    modules: set[str] = set()
    packages: set[str] = set()
    stack = [(0, "")]  # (indent of the package's entry, its path)
    for line in _tree():
        indent = len(line) - len(line.lstrip())
        while indent < stack[-1][0] + 2:  # an entry of an outer package
            stack.pop()
        here = stack[-1][1]
        body = line.strip()
        if indent == stack[-1][0] + 2:  # an entry of this package
            m = FOLDERS.match(body)
            if m:
                names = [f.strip(" ,/") for f in m.group(1).split(",") if f.strip(" ,/")]
                for name in names:
                    packages.add(f"{here}{name}")
                if len(names) == 1:
                    stack.append((indent, f"{here}{names[0]}/"))
                body = body[m.end():]
                here = stack[-1][1]
        for token in MODULE.findall(body):
            if "/" in token:
                if token.split("/")[0] in top_folders:
                    modules.add(f"{token}.py")
            else:
                modules.add(f"{here}{token}.py")
    return modules, packages


def on_disk() -> tuple[set[str], set[str]]:
    modules = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
               if p.name != "__init__.py" and "__pycache__" not in p.parts}
    packages = {str(p.parent.relative_to(PACKAGE)) for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE}
    return modules, packages


def test_every_module_of_the_package_is_named_in_the_architecture_tree():
    named, named_packages = named_in_doc()
    modules, packages = on_disk()
    assert sorted(modules - named) == []
    assert sorted(packages - named_packages) == []


def test_the_architecture_tree_names_no_module_that_does_not_exist():
    named, named_packages = named_in_doc()
    modules, packages = on_disk()
    assert sorted(named - modules) == []
    assert sorted(named_packages - packages) == []
