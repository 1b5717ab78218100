"""pyproject.toml declares what the package and the workflow import: every third-party module
they import comes from a declared dependency (core or an extra), and every core dependency is
imported somewhere (accelerate is only a launcher: an extra, never imported)."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Snakemake files are not Python to ast: their top-level import lines are.
_IMPORT_LINE = re.compile(r"^\s*(?:import|from)\s+(\w+)", re.M)


def _distribution(requirement: str) -> str:
    name = re.match(r"[A-Za-z0-9._-]+", requirement)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def _imported_modules(files: list[Path]) -> dict[str, set[str]]:
    """Top-level third-party module -> the files importing it."""
    found: dict[str, set[str]] = {}
    for path in files:
        text = path.read_text()
        if path.suffix == ".py":
            names = set()
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.Import):
                    names |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
        else:
            names = set(_IMPORT_LINE.findall(text))
        for name in names - set(sys.stdlib_module_names) - {"lerobot_pipe"}:
            found.setdefault(name, set()).add(str(path.relative_to(REPO)))
    return found


def _declared() -> tuple[set[str], set[str]]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = {_distribution(r) for r in project["dependencies"]}
    extras = {
        _distribution(r) for group in project["optional-dependencies"].values() for r in group
    }
    return core, extras


def _files() -> list[Path]:
    return [
        *sorted((REPO / "lerobot_pipe").rglob("*.py")),
        *sorted((REPO / "workflow").rglob("*.py")),
        *sorted((REPO / "workflow").rglob("*.smk")),
        REPO / "Snakefile",
    ]


def test_every_import_is_declared():
    core, extras = _declared()
    providers = importlib.metadata.packages_distributions()
    undeclared = {
        module: sorted(files)
        for module, files in _imported_modules(_files()).items()
        if not {_distribution(d) for d in providers.get(module, [module])} & (core | extras)
    }
    assert not undeclared, f"imported but not in pyproject.toml's dependencies: {undeclared}"


def test_every_core_dependency_is_imported_and_accelerate_is_not():
    core, _ = _declared()
    providers = importlib.metadata.packages_distributions()
    package = _imported_modules(sorted((REPO / "lerobot_pipe").rglob("*.py")))
    imported = {_distribution(d) for m in package for d in providers.get(m, [m])}
    assert core <= imported, f"core dependencies nothing imports: {sorted(core - imported)}"
    assert "accelerate" not in package, package.get("accelerate")
