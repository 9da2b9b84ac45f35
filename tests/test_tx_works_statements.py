"""Every statement on the ``works`` table that a transaction sends straight to its connection, past
`TxBase._one` and `TxBase._all` (which write the revision bumps and state moves that wait first:
`TxBase.bump_work`, `Tx.move_later`), neither reads nor writes what those wait to write (a Work's
revision, state and time of last change) nor deletes a Work, or comes after an explicit write of
them in its method.

Catches: a new ``self._conn.execute`` that writes or reads a Work's state, revision or time of last
change while a bump or a move waits: the write would be overwritten by the bump, or undo the move's
compare-and-set, and the read would answer the row without them. And every statement that writes Works'
inputs tells its transaction whose inputs it wrote, and every one that writes routing checkpoints or
attempts' rows tells it what it wrote or that what was kept of them no longer answers (what an earlier
commit left of them would answer later transactions wrong: `TxBase.committed`).
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

import loom.store

STORE = Path(loom.store.__file__).parent
ON_WORKS = re.compile(r"\bworks\b")
WAITING = re.compile(r"\b(revision|updated_at_ms|state)\b")
"""The columns of ``works`` a bump or a move that waits writes (and a read may name)."""
FLUSHES = {"_flush_bumps", "write_bumps"}
INPUTS_TOLD = {"_inputs_changed", "_inputs_lost", "_left_pending"}
"""What a method that writes Works' inputs names to tell its transaction so (`TxBase.committed`)."""
CHECKPOINTS_TOLD = {"routed", "lose_routed"}
"""What a method that writes routing checkpoints names to tell its transaction so (`InputsTx.routed_input`)."""
ATTEMPTS_TOLD = {"attempts", "changed_attempt", "lose_attempts", "_writing_attempt"}
"""What a method that writes attempts' rows names to tell its transaction so (`ExecutionsTx._kept_attempt`;
`_writing_attempt` tells it, then keeps the row as written)."""
KV_TOLD = {"kv_written"}
"""What a method that writes KV entries names to tell its transaction so (`Tx.kv_get`)."""
PASS_THROUGH = {"_one", "_all", "_one_work", "_flush_bumps", "lock_pool"}
"""Methods that send a statement their caller gives (`TxBase`'s own: checked at their callers), and
`AdmissionTx.lock_pool`, which sends its dialect's advisory lock (no table)."""


def sql_of(node: ast.expr, module: object) -> str | None:
    """The text of a statement as far as the source says it (an f-string's fixed parts, a module
    constant); ``None`` where it does not."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(
            v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)
        )
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = sql_of(node.left, module), sql_of(node.right, module)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.IfExp):  # (either text: both are checked)
        body, orelse = sql_of(node.body, module), sql_of(node.orelse, module)
        return None if body is None or orelse is None else f"{body} {orelse}"
    if isinstance(node, ast.Name) and isinstance(getattr(module, node.id, None), str):
        return str(getattr(module, node.id))
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):  # (``_sql.INSERT_EVENT``)
        text = getattr(getattr(module, node.value.id, None), node.attr, None)
        return text if isinstance(text, str) else None
    return None


def direct_statements() -> list[tuple[str, str, int, str | None, bool, set[str]]]:
    """Each ``.execute``/``.executemany`` in the transaction modules: module, method, line, its text
    (``None``: not known from the source), whether a flush of what waits comes before it, and the
    attributes its method names (what it tells the transaction: `INPUTS_TOLD`, `CHECKPOINTS_TOLD`)."""
    found = []
    for path in sorted(STORE.glob("_tx*.py")):
        module = importlib.import_module(f"loom.store.{path.stem}")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef):
                continue
            calls = [node for node in ast.walk(function) if isinstance(node, ast.Call)]
            flushed_at = [
                c.lineno for c in calls if isinstance(c.func, ast.Attribute) and c.func.attr in FLUSHES
            ]
            named = {n.attr for n in ast.walk(function) if isinstance(n, ast.Attribute)}
            for call in calls:
                if isinstance(call.func, ast.Attribute) and call.func.attr in ("execute", "executemany"):
                    text = sql_of(call.args[0], module) if call.args else None
                    flushed = any(line < call.lineno for line in flushed_at)
                    found.append((path.stem, function.name, call.lineno, text, flushed, named))
    return found


def test_direct_statements_on_works_leave_what_waits_alone() -> None:
    statements = direct_statements()
    assert len(statements) > 40, f"only {len(statements)} statements found: the scan lost its way"
    unknown = [(m, f, line) for m, f, line, text, *_ in statements if text is None and f not in PASS_THROUGH]
    assert unknown == [], f"statements whose text the source does not say: {unknown}"
    on_works = [
        (m, f, line, text, flushed)
        for m, f, line, text, flushed, _ in statements
        if text and ON_WORKS.search(text)
    ]
    assert on_works, "no direct statement on works found: the scan lost its way"
    wrong = [
        (m, f, line, text)
        for m, f, line, text, flushed in on_works
        if (WAITING.search(text) or text.startswith("DELETE FROM works "))
        and not flushed
        and not text.startswith("INSERT INTO works ")
    ]  # (a Work deleted takes what waits for it along; a Work inserted is new: nothing waits for it)
    assert wrong == [], f"direct statements on what a bump or move that waits writes: {wrong}"


@pytest.mark.parametrize(
    ("table", "told", "at_least"),
    [
        ("work_inputs", INPUTS_TOLD, 4),
        ("checkpoints", CHECKPOINTS_TOLD, 4),
        ("executions", ATTEMPTS_TOLD, 8),
        ("kv", KV_TOLD, 2),
    ],
    ids=["inputs", "checkpoints", "attempts", "kv"],
)
def test_direct_writes_tell_what_they_change_of_what_is_carried(
    table: str, told: set[str], at_least: int
) -> None:
    """A statement that inserts, updates or deletes Works' inputs, routing checkpoints, attempts' rows
    or KV entries sits in a method that tells the transaction what it wrote (`INPUTS_TOLD`,
    `CHECKPOINTS_TOLD`, `ATTEMPTS_TOLD`, `KV_TOLD`), so that what an earlier commit left of them
    (`Carried.pending`, `Carried.routed`, `Carried.attempts`, `Carried.kv`) no longer answers. Catches:
    a new write that does not (the next transaction would answer a Work's pending inputs without it,
    claim with the binding of a route its Event no longer has, read an attempt as it was before a
    renewal, an end or an adoption, or a cursor or watermark as it was before it moved)."""
    writes = [
        (m, f, line, bool(named & told))
        for m, f, line, text, named in all_statements()  # (through `TxBase._one` and `_all` too)
        if text and re.match(rf"\s*(INSERT INTO|UPDATE|DELETE FROM) {table}\b", text)
    ]
    assert len(writes) >= at_least, f"only {writes} writes of {table} found: the scan lost its way"
    assert [w for w in writes if not w[3]] == [], f"writes of {table} that tell nothing: {writes}"


WORK_PARTS = re.compile(
    r"\s*((INSERT INTO|UPDATE|DELETE FROM) (works|work_keys|waits|work_inputs)\b"
    r"|(INSERT INTO|DELETE FROM) executions\b|UPDATE executions SET state\b)"
)
"""Writes of a Work's row or of its parts as a read of it gives them (`_sql.work_with_parts`, the
admission facts, the queue place): its keys, its open wait, its inputs, its live attempt (an attempt's
other columns are no part of it)."""
WORKS_TOLD = {"touch", "work_written", "lose_works"}
"""What a method that writes them names to tell its transaction which Work (`ToCarry.work_written`)."""
SENDERS = {"execute", "executemany", "_one", "_all", "_one_work"}


def all_statements() -> list[tuple[str, str, int, str | None, set[str]]]:
    """Every statement the transaction modules send, through `TxBase`'s plumbing too: module, method,
    line, its text (``None``: not known from the source) and the attributes its method names."""
    found = []
    for path in sorted(STORE.glob("_tx*.py")):
        module = importlib.import_module(f"loom.store.{path.stem}")
        for function in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(function, ast.FunctionDef):
                continue
            named = {n.attr for n in ast.walk(function) if isinstance(n, ast.Attribute)}
            for call in ast.walk(function):
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.args:
                    if call.func.attr in SENDERS:
                        text = sql_of(call.args[0], module)
                        found.append((path.stem, function.name, call.lineno, text, named))
    return found


def test_writes_of_a_works_row_or_parts_tell_which_work() -> None:
    """Every statement that writes a Work's row, keys, waits, inputs or live attempt sits in a method
    that tells its transaction which Work (`WORKS_TOLD`), so that what is known of it (`Carried.of_works`,
    and within the transaction through other Works' writes) no longer answers; but the writes of the
    revision bumps and state moves that wait, which their callers told when they were made
    (`TxBase._flush_bumps`). Catches: a new write that does not (the next transaction would answer the
    Work as it was: a key, hold, wait or place it no longer has)."""
    writes = [
        (m, f, line, bool(named & WORKS_TOLD))
        for m, f, line, text, named in all_statements()
        if text and WORK_PARTS.match(text) and f != "_flush_bumps"
    ]
    assert len(writes) >= 25, f"only {writes} writes of Works' rows or parts found: the scan lost its way"
    assert [w for w in writes if not w[3]] == [], (
        f"writes of Works' rows or parts that tell nothing: {writes}"
    )
