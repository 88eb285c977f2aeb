"""docs/ARCHITECTURE.md's trees name every module of the product package and of the verification package, and no
module that is not there; the product never imports the verification package.

A tree is the code block's part under ``mcore_dapo/`` (or ``mcore_dapo_checks/``): a package is an entry ``name/`` (its entries two
columns further in), a module ``name.py`` in an entry or in the text of its package's entries; a path
``pkg/name.py`` whose first part is one of the package's folders names that module (other paths, such as
``megatron/core/fp8_utils.py``, are other projects' files). No Megatron, no process: text and files only.
"""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mcore_dapo"
CHECKS = ROOT / "mcore_dapo_checks"
DOC = ROOT / "docs" / "ARCHITECTURE.md"
MODULE = re.compile(r"(?<![\w./-])((?:[A-Za-z_]\w*/)*[A-Za-z_]\w*)\.py\b")
FOLDERS = re.compile(r"^((?:[A-Za-z_]\w*/,?\s*)+)(?:\s{2,}|$)")


def _tree(package: Path = PACKAGE) -> list[str]:
    text = DOC.read_text()
    head = re.search(rf"^{package.name}/.*\n", text, re.M)
    start = head.end()
    lines = []
    for line in text[start:].splitlines():
        if not line.startswith(" "):  # the next package, patches/manifest.toml, configs/, tools/: outside it
            break
        if line.startswith("   ") and not lines:  # the package's own description, continued
            continue
        lines.append(line)
    return lines


def named_in_doc(package: Path = PACKAGE) -> tuple[set[str], set[str]]:
    """(modules, packages) the tree names, as paths relative to the package (``bridge/layout.py``, ``bridge``)."""
    top_folders = {p.name for p in package.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    modules: set[str] = set()
    packages: set[str] = set()
    stack = [(0, "")]  # (indent of the package's entry, its path)
    for line in _tree(package):
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


def on_disk(package: Path = PACKAGE) -> tuple[set[str], set[str]]:
    modules = {str(p.relative_to(package)) for p in package.rglob("*.py")
               if p.name != "__init__.py" and "__pycache__" not in p.parts}
    packages = {str(p.parent.relative_to(package)) for p in package.rglob("__init__.py") if p.parent != package}
    return modules, packages


@pytest.mark.parametrize("package", [PACKAGE, CHECKS], ids=lambda p: p.name)
def test_every_module_of_the_package_is_named_in_the_architecture_tree(package):
    named, named_packages = named_in_doc(package)
    modules, packages = on_disk(package)
    assert sorted(modules - named) == []
    assert sorted(packages - named_packages) == []


@pytest.mark.parametrize("package", [PACKAGE, CHECKS], ids=lambda p: p.name)
def test_the_architecture_tree_names_no_module_that_does_not_exist(package):
    named, named_packages = named_in_doc(package)
    modules, packages = on_disk(package)
    assert sorted(named - modules) == []
    assert sorted(named_packages - packages) == []


def references_to(package: str, source: str) -> list[str]:
    """Where a module's code reaches ``package``: its imports, and strings naming a module of it (``-m pkg.x``,
    ``"pkg.x:attr"``, importlib's names); docstrings and comments are text, not a reach."""
    tree = ast.parse(source)
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            out += [f"line {n.lineno}: import {a.name}" for a in n.names if a.name.split(".")[0] == package]
        elif isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == package:
            out.append(f"line {n.lineno}: from {n.module} import ...")
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings \
                and re.match(rf"{package}(\.|:|$)", n.value):
            out.append(f"line {n.lineno}: {n.value!r}")
    return out


def test_the_product_never_reaches_the_verification_package():
    found = {str(p.relative_to(ROOT)): r for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts
             for r in [references_to(CHECKS.name, p.read_text())] if r}
    assert found == {}


def test_the_reach_check_sees_an_import_and_a_module_string():
    # the check above on sources that do reach it: what it must see
    assert references_to("mcore_dapo_checks", "from mcore_dapo_checks import demo\n") == \
        ["line 1: from mcore_dapo_checks import ..."]
    assert references_to("mcore_dapo_checks", "import mcore_dapo_checks.tiny as t\n") == \
        ["line 1: import mcore_dapo_checks.tiny"]
    assert references_to("mcore_dapo_checks", 'cmd = ["-m", "mcore_dapo_checks.logits"]\n') == \
        ["line 1: 'mcore_dapo_checks.logits'"]
    # text about it is not a reach
    assert references_to("mcore_dapo_checks", '"""Run by mcore_dapo_checks.audit."""\nx = 1  # mcore_dapo_checks\n') == []


# import circles the product keeps, each a module group that is one unit by design: the model registry (the HF config
# reader asks the registered models, which read HF configs) and the patch registry (a type-checking import)
BENIGN_CIRCLES = [
    {"bridge.hf_config", "bridge.models", "bridge.models.qwen3", "bridge.models.qwen3.hf_config",
     "bridge.models.qwen3.megatron"},
    {"patching.patcher", "patching.registry"},
]


def import_graph(package: Path) -> dict[str, set[str]]:
    """module -> the package's modules it imports (anywhere in it, functions too; a package's ``__init__`` is its
    name), from the sources."""
    mods = {}
    for f in package.rglob("*.py"):
        if "__pycache__" in f.parts:
            continue
        rel = f.relative_to(package.parent).with_suffix("")
        mods[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = f

    def resolve(name):
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    edges = {m: set() for m in mods}
    for m, f in mods.items():
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, ast.Import):
                targets = [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom):
                base = n.module or ""
                if n.level:
                    parts = m.split(".") if f.name == "__init__.py" else m.split(".")[:-1]
                    parts = parts[:len(parts) - (n.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in n.names]
            else:
                continue
            edges[m] |= {r for t in targets if t.split(".")[0] == package.name for r in [resolve(t)] if r and r != m}
    return edges


def circles(edges: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(group)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_products_only_import_circles_are_the_two_benign_ones():
    found = [{m.removeprefix("mcore_dapo.") for m in c} for c in circles(import_graph(PACKAGE))]
    assert sorted(map(sorted, found)) == sorted(map(sorted, BENIGN_CIRCLES))


def test_patching_never_imports_the_device_adapters():
    """The patches sit below the adapters (an adapter applies its device's patches); where a patch needs to know
    the host, it asks mcore_dapo/host.py, a leaf."""
    edges = import_graph(PACKAGE)
    up = sorted(f"{m} -> {t}" for m, ts in edges.items() if m.startswith("mcore_dapo.patching")
                for t in ts if t.startswith("mcore_dapo.devices"))
    assert up == []
    assert edges["mcore_dapo.host"] <= {"mcore_dapo.errors"}, edges["mcore_dapo.host"]


def test_the_circle_check_sees_a_circle_through_a_function_level_import(tmp_path):
    pkg = tmp_path / "mcore_dapo"
    (pkg / "a").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("")
    (pkg / "a" / "x.py").write_text("from mcore_dapo.b import y\n")
    (pkg / "b.py").write_text("def f():\n    from .a import x\n")
    (pkg / "c.py").write_text("import mcore_dapo.b\n")
    assert circles(import_graph(pkg)) == [{"mcore_dapo.a.x", "mcore_dapo.b"}]


# docs/ARCHITECTURE.md, "Layers": each of the product's top-level modules and packages at its layer; a module imports
# its own layer and those below only (leaves at 0; env, the `mcore-dapo env` report, is a product over the devices)
LAYERS = {
    0: {"errors", "host", "resources", "versions"},
    1: {"bridge", "launch_keys"},
    2: {"devices", "patching", "io", "megatron_compat"},
    3: {"runtime"},
    4: {"convert", "resharding", "verl_plugin", "verl_cpu", "plan", "metrics", "migrate", "data_check", "env"},
    5: {"cli"},
}


def arrows_up(edges: dict[str, set[str]]) -> list[str]:
    """The imports of a module of a higher layer than its own (a top-level name missing from LAYERS is one too)."""
    level = {name: n for n, names in LAYERS.items() for name in names}

    def of(module):
        top = module.split(".")[1] if "." in module else ""
        return level.get(top, -1 if top == "" else None)

    out = []
    for m, targets in sorted(edges.items()):
        if of(m) is None:
            out.append(f"{m}: not in LAYERS")
            continue
        out += [f"{m} -> {t}" for t in sorted(targets) if of(t) is None or of(t) > of(m)]
    return out


def test_no_module_imports_a_layer_above_its_own():
    assert arrows_up(import_graph(PACKAGE)) == []


def test_the_layer_check_sees_an_import_upward():
    edges = import_graph(PACKAGE)
    edges["mcore_dapo.devices.cpu"] = edges["mcore_dapo.devices.cpu"] | {"mcore_dapo.resharding.vllm_target"}
    assert arrows_up(edges) == ["mcore_dapo.devices.cpu -> mcore_dapo.resharding.vllm_target"]
