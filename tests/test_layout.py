"""The source layout stays readable: every module of the package fits in 500 lines, and no function
hides an import (an import inside a function is how an import cycle gets hidden).

Catches: a module that grew past the limit (a new job that belongs in a module of its own), and a
``from ..x import y`` moved into a function body to dodge a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import loom

PACKAGE = Path(loom.__file__).parent
LIMIT = 500


def modules() -> list[Path]:
    found = sorted(PACKAGE.rglob("*.py"))
    assert len(found) > 50, f"only {len(found)} modules under {PACKAGE}"
    return found


def test_no_module_is_over_500_lines() -> None:
    long = {
        str(path.relative_to(PACKAGE.parent)): n
        for path in modules()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > LIMIT
    }
    assert long == {}, f"modules over {LIMIT} lines: {long}"


def test_no_import_inside_a_function() -> None:
    hidden: list[str] = []
    for path in modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(func):
                if isinstance(node, ast.ImportFrom) and node.level > 0:
                    hidden.append(
                        f"{path.relative_to(PACKAGE.parent)}:{node.lineno} from {'.' * node.level}{node.module}"
                    )
    assert hidden == [], "imports of loom's own modules inside functions:\n" + "\n".join(hidden)
