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


LAZY = ("loom/service/cli.py", "loom/service/_cli_")
"""The command line's modules import what a command needs when it runs, so ``loom --help`` and shell
completion start without the runtime (tests/test_cli.py pins which modules a parse loads). Nothing
imports these modules but ``cli.py``, so no cycle can hide in them."""


def test_no_import_inside_a_function() -> None:
    hidden: list[str] = []
    for path in modules():
        if str(path.relative_to(PACKAGE.parent)).startswith(LAZY):
            continue
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


def _outside(*layers: str) -> list[Path]:
    return [path for path in modules() if path.relative_to(PACKAGE).parts[0] not in layers]


def test_transaction_procedures_live_in_the_kernel_and_the_store() -> None:
    """Every state change is a procedure of the kernel (or a read of the store): a ``tx: Tx`` function
    in an actor, the runtime or the service is a sequence written beside the kernel's. Catches: a
    procedure defined next to its caller (an actor's own ``_in_tx``)."""
    found: list[str] = []
    for path in _outside("kernel", "store"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for func in ast.walk(tree):
            if isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                for arg in func.args.args:
                    annotation = ast.unparse(arg.annotation) if arg.annotation else ""
                    if annotation.split(".")[-1] == "Tx":
                        found.append(f"{path.relative_to(PACKAGE.parent)}:{func.lineno} {func.name}")
    assert found == [], "procedures outside loom/kernel and loom/store:\n" + "\n".join(found)


def test_the_backend_is_known_only_to_the_store() -> None:
    """Which database a runtime runs on is the store's business: only loom/store (and the test
    harness, which starts servers and reads files) import a database driver or look at a URL's scheme.
    Catches: a layer above the store that branches on PostgreSQL or SQLite."""
    found: list[str] = []
    for path in _outside("store", "testing"):
        text = path.read_text(encoding="utf-8")
        for needle in (
            "import sqlite3",
            "import psycopg",
            "from psycopg",
            "is_postgres_url",
            'startswith("postgres',
        ):
            if needle in text:
                found.append(f"{path.relative_to(PACKAGE.parent)}: {needle}")
    assert found == [], "\n".join(found)
