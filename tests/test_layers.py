"""The layers of lerobot_pipe/ import one way: every import of the package (at the top of a file
or inside a function, relative or absolute) goes to the importer's own layer or a lower one, as
the layer table in docs/design.md's module map says, and that table lists every subpackage and
top-level module there is."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "lerobot_pipe"
DESIGN = ROOT / "docs" / "design.md"
# The package's own __init__ (``from lerobot_pipe import __version__``) is a unit of layer 0.
INIT = "__init__"


@dataclass(frozen=True)
class Import:
    path: Path
    line: int
    source: str  # the importer's unit: a subpackage or a top-level module
    target: str  # the imported unit


def layer_table(design: Path = DESIGN) -> dict[str, int]:
    """The units of the "Layers" table of docs/design.md's "Module map" section, by layer."""
    text = design.read_text()
    section = text.split("## Module map", 1)[1].split("\n## ", 1)[0]
    table = section.split("### Layers", 1)[1].split("\n### ", 1)[0]
    layers: dict[str, int] = {}
    for row in re.findall(r"^\| (\d+) \| ([^|]+) \|", table, flags=re.M):
        for unit in re.findall(r"`([^`]+)`", row[1]):
            assert unit not in layers, f"{design}: {unit} is listed in two layers"
            layers[unit] = int(row[0])
    return layers


def units(package: Path) -> set[str]:
    """The subpackages and top-level modules of ``package`` (its ``__init__`` included)."""
    found = {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
    return found | {p.stem for p in package.glob("*.py")}


def _module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == INIT else parts)


def _targets(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """Absolute names of what ``node`` imports (``from a import b``: ``a.b``, which may be a
    module or a name in ``a``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parent = module.split(".")
            parent = parent[: len(parent) - node.level + (1 if is_package else 0)]
            base = ".".join([*parent, *([node.module] if node.module else [])])
        return [f"{base}.{alias.name}" for alias in node.names]
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute | ast.Name)
        and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        return [node.args[0].value]
    return []


def _unit(name: str, known: set[str]) -> str | None:
    """The unit of the package an absolute name falls in; None outside the package."""
    parts = name.split(".")
    if parts[0] != PACKAGE:
        return None
    return parts[1] if len(parts) > 1 and parts[1] in known else INIT


def package_imports(package: Path) -> list[Import]:
    """Every import of ``package`` from one of its units into another."""
    known = units(package)
    found: dict[tuple[Path, int, str], Import] = {}
    for path in sorted(package.rglob("*.py")):
        module = _module_name(path, package)
        source = _unit(module, known)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for name in _targets(node, module, path.name == f"{INIT}.py"):
                target = _unit(name, known)
                if target is not None and target != source:
                    found[path, node.lineno, target] = Import(path, node.lineno, source, target)
    return list(found.values())


def layer_violations(package: Path, layers: dict[str, int]) -> list[str]:
    return [
        f"{i.path.relative_to(package.parent)}:{i.line}: {i.source} (layer {layers[i.source]}) "
        f"imports {i.target} (layer {layers[i.target]})"
        for i in package_imports(package)
        if layers[i.target] > layers[i.source]
    ]


def test_the_layer_table_lists_every_subpackage_and_top_level_module():
    listed, present = set(layer_table()), units(ROOT / PACKAGE)
    assert not present - listed, (
        f"lerobot_pipe/ has {sorted(present - listed)}, which the layer table of "
        f"{DESIGN.relative_to(ROOT)} does not list: add each to its layer there"
    )
    assert not listed - present, (
        f"the layer table of {DESIGN.relative_to(ROOT)} lists {sorted(listed - present)}, "
        "which lerobot_pipe/ does not have: remove them there"
    )


def test_no_module_imports_from_a_higher_layer():
    violations = layer_violations(ROOT / PACKAGE, layer_table())
    assert not violations, (
        "imports against the layers of docs/design.md (move the code down, or invert the "
        "dependency):\n" + "\n".join(violations)
    )


def test_the_reader_sees_lazy_relative_and_dynamic_imports(tmp_path):
    package = tmp_path / PACKAGE
    for unit in ("low", "high"):
        (package / unit).mkdir(parents=True)
        (package / unit / f"{INIT}.py").write_text("")
    (package / f"{INIT}.py").write_text("")
    (package / "low" / "lazy.py").write_text("def f():\n    from lerobot_pipe.high import x\n")
    (package / "low" / "relative.py").write_text("from ..high import y\n")
    (package / "low" / f"{INIT}.py").write_text("from .. import high\n")
    (package / "low" / "dynamic.py").write_text(
        "import importlib\nimportlib.import_module('lerobot_pipe.high.z')\n"
    )
    (package / "high" / "fine.py").write_text("import lerobot_pipe.low.lazy\n")
    found = layer_violations(package, {INIT: 0, "low": 1, "high": 2})
    assert sorted(v.split(":")[0] for v in found) == [
        f"{PACKAGE}/low/__init__.py",
        f"{PACKAGE}/low/dynamic.py",
        f"{PACKAGE}/low/lazy.py",
        f"{PACKAGE}/low/relative.py",
    ]


def module_rows(design: Path = DESIGN) -> set[str]:
    """The modules the "Modules" table of the module map names (``pkg/module``, ``pkg/*`` for
    every module of a package, several per row)."""
    section = DESIGN.read_text().split("## Module map", 1)[1].split("\n## ", 1)[0]
    table = section.split("### Modules", 1)[1]
    named: set[str] = set()
    for first_cell in re.findall(r"^\| ([^|]+) \|", table, flags=re.M):
        named.update(re.findall(r"`([^`]+)`", first_cell))
    return named


def test_the_module_table_names_every_module():
    named = module_rows()
    package = ROOT / PACKAGE
    missing = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).with_suffix("")
        if relative.name == INIT:
            continue
        name = relative.as_posix()
        wildcards = [f"{'/'.join(relative.parts[:i])}/*" for i in range(1, len(relative.parts))]
        if name not in named and not any(w in named for w in wildcards):
            missing.append(name)
    assert not missing, (
        f"the module table of {DESIGN.relative_to(ROOT)} does not name {missing}: one row each "
        "(what it holds)"
    )
