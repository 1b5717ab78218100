"""docs/compatibility.md names, for each row, the test that proves it: those tests exist."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
DOC = TESTS.parent / "docs" / "compatibility.md"
# `interop/test_configs.py::test_x[id]` or a continuation `::test_y` in the same cell.
REFERENCE = re.compile(r"`(?:(?P<file>[\w/]+\.py))?::(?P<test>test_\w+)(?:\[(?P<id>[^\]]*)\])?`")


def test_every_test_the_doc_names_exists():
    found = 0
    current = None
    for line in DOC.read_text().splitlines():
        for match in REFERENCE.finditer(line):
            current = match["file"] or current
            assert current is not None, f"{match[0]} names no file: {line}"
            source = (TESTS / current).read_text()
            assert f"def {match['test']}(" in source, f"{match[0]} not in tests/{current}"
            if match["id"]:  # a parameter id: written as a string in the test's module
                assert f'"{match["id"]}"' in source, f"{match[0]}: no such parameter"
            found += 1
    assert found >= 20
