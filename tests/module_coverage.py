"""Which modules of lerobot_pipe a selection of tests covers: imported while the tests ran, or
named by their code (an import, a ``python -m`` or monkeypatch target, the console script that
runs it), directly or through the test helpers they import. tests/test_fast_tier.py checks the
fast tier with it; under pytest-xdist tests/conftest.py gathers the workers' imports and checks
them at the end of the session."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "lerobot_pipe"
TESTS = REPO / "tests"
_MODULE_NAME = re.compile(rf"\b{PACKAGE}(?:\.\w+)+")


def package_modules() -> set[str]:
    """Every module of the package, by dotted name (a package by its own name)."""
    names = set()
    for path in (REPO / PACKAGE).rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def reexports() -> dict[str, str]:
    """``package.name`` -> the module a package's ``__init__.py`` imports ``name`` from, so that
    ``from lerobot_pipe.datasets import LeRobotDataset`` names datasets/lerobot_dataset.py."""
    found = {}
    for init in (REPO / PACKAGE).rglob("__init__.py"):
        package = ".".join(init.relative_to(REPO).parent.parts)
        for node in ast.walk(ast.parse(init.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found |= {
                    f"{package}.{alias.asname or alias.name}": node.module for alias in node.names
                }
    return found


def console_scripts() -> dict[str, str]:
    """Console script name -> the module it runs (pyproject.toml's [project.scripts])."""
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    return {name: target.split(":")[0] for name, target in scripts.items()}


def with_parents(module: str) -> set[str]:
    """Importing a.b.c runs a/__init__.py and a/b/__init__.py too."""
    parts = module.split(".")
    return {".".join(parts[: i + 1]) for i in range(len(parts))}


def names_in(path: Path, modules: set[str], scripts: dict[str, str]) -> tuple[set[str], set[str]]:
    """The package modules a test file names, and the test-side helper modules it imports."""
    tree = ast.parse(path.read_text(), filename=str(path))
    named: set[str] = set()
    helpers: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            imported = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            imported = _MODULE_NAME.findall(node.value)
            imported += [module for name, module in scripts.items() if name in node.value]
        else:
            continue
        for name in imported:
            if name.split(".")[0] == PACKAGE:
                name = REEXPORTS.get(name, name)
                named |= {m for m in with_parents(name) if m in modules}
            elif "." not in name:
                helpers.add(name)
    return named, helpers


def helper_files(helper: str, near: Path) -> list[Path]:
    """Where a test's ``import tiny`` / ``from snakemake_runs import ...`` comes from: its own
    folder or tests/ (both on sys.path, see pyproject.toml and tests/workflow/conftest.py)."""
    return [p for p in (near.parent / f"{helper}.py", TESTS / f"{helper}.py") if p.is_file()]


def modules_named_by(test_files: set[Path]) -> set[str]:
    modules, scripts = package_modules(), console_scripts()
    named: set[str] = set()
    pending = set(test_files)
    for test_file in test_files:  # the conftest.py files that pytest loads for each test
        for folder in test_file.parents:
            if folder == TESTS.parent:
                break
            pending |= {p for p in [folder / "conftest.py"] if p.is_file()}
    seen: set[Path] = set()
    while pending:
        path = pending.pop()
        seen.add(path)
        found, helpers = names_in(path, modules, scripts)
        named |= found
        for helper in helpers:
            pending |= set(helper_files(helper, path)) - seen
    return named


REEXPORTS = reexports()


def whole_suite_collected(config: pytest.Config) -> bool:
    """No paths given: pytest collected tests/ (pyproject.toml's testpaths), no -k."""
    return config.args_source == pytest.Config.ArgsSource.TESTPATHS and not config.option.keyword


def imported_package_modules() -> set[str]:
    """The modules of the package this process has imported."""
    return {name for name in sys.modules if name.split(".")[0] == PACKAGE}


def missing_modules(imported: set[str], test_files: set[Path]) -> list[str]:
    """The package's modules that neither ran (``imported``) nor are named by ``test_files``."""
    return sorted(package_modules() - imported - modules_named_by(test_files))


def missing_message(missing: list[str]) -> str:
    return (
        f"no test of the fast tier imports or runs {', '.join(missing)}: give each a fast test "
        "(one not marked slow, interop or slurm)"
    )
