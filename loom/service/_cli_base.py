"""What the ``loom`` commands share: the server options, one-line user errors, JSON arguments (``@file``,
``@-`` for stdin), output, and paging through a list route.

This module and the command modules import only what a command needs to parse its arguments: the
HTTP client, the renderer and the runtime are imported when a command runs, so ``loom --help`` and
shell completion start fast (tests/test_cli_speed.py measures it).
"""

from __future__ import annotations

import functools
import json
import re
import stat
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import typer

if TYPE_CHECKING:
    from ._client import Client

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_URL = "http://127.0.0.1:8440"
CONTEXT = {"help_option_names": ["-h", "--help"]}
"""Every command and group takes ``-h`` as well as ``--help``."""

URL = typer.Option(DEFAULT_URL, "--url", envvar="LOOM_URL", help="The running server's address.")
AS_JSON = typer.Option(False, "--json", help="Print the server's JSON answer as it is.")
TOKEN_FILE = typer.Option(
    None,
    "--token-file",
    envvar="LOOM_API_TOKEN_FILE",
    help="A file holding the server's operator token (when it requires one).",
)
LIMIT = typer.Option(100, "--limit", min=1, max=1000, help="At most this many per page (1 to 1000).")
ALL = typer.Option(False, "--all", help="Every page, not only the first.")


def group(help: str) -> typer.Typer:
    return typer.Typer(no_args_is_help=True, help=help, context_settings=CONTEXT, rich_markup_mode=None)


class UserError(Exception):
    """A failure the user can act on: the CLI prints its one line to stderr and exits with ``status``
    (1 unless a command says otherwise: ``loom work wait`` tells some failures apart by their status)."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def fail(message: str, status: int = 1) -> typer.Exit:
    """Print ``message`` as one line (a server's refusal may quote text holding a newline or an escape
    sequence: `printable` shows it escaped) and give the exit that ends the command with ``status``."""
    from ._render import printable

    typer.echo(f"loom: {printable(message)}", err=True)
    return typer.Exit(status)


def user_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Turn every error a user can cause into one line on stderr and exit status 1 (a `UserError`'s
    own ``status``)."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        from ..records.errors import LoomError

        try:
            return command(*args, **kwargs)
        except UserError as exc:
            raise fail(str(exc), exc.status) from None
        except LoomError as exc:
            raise fail(str(exc)) from None
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        except BrokenPipeError:  # `loom events list --all | head`: the reader has what it wanted
            sys.stderr.close()
            raise typer.Exit(0) from None

    return run


def client(url: str, token_file: Path | None) -> Client:
    from ._client import Client
    from ._token import read_token_file

    return Client(url, token=read_token_file(token_file) if token_file is not None else None)


MIB = 1024 * 1024
MAX_BODY_BYTES = 2 * MIB
"""The largest body the server takes for one Event (`loom.service._wire.MAX_BODY_BYTES`), and
`MAX_BATCH_BYTES` for a batch (`loom.service._batch.MAX_BATCH_BYTES`): the CLI refuses a larger one
before sending it. (Not imported from there: that would cost ``loom send`` the HTTP server's imports;
tests/test_cli_input.py checks they are the same.)"""
MAX_BATCH_BYTES = 16 * MIB


def read_argument(text: str, option: str) -> str:
    """``text`` as given, the contents of a file for ``@path``, or standard input for ``@-``: UTF-8
    text, or `UserError` saying it is not (and naming the file)."""
    if not text.startswith("@"):
        if not _is_text(text):  # bytes in the command line that are not UTF-8 (held as lone surrogates)
            raise UserError(f"{option} is not UTF-8 text")
        return text
    return read_text(text[1:], option, text)


def read_text(path: str, option: str, shown: str | None = None) -> str:
    """The text of the file ``path`` (``-``: standard input), which must be UTF-8; a failure is
    `UserError` naming ``option`` and the file (as ``shown``, when given)."""
    shown = path if shown is None else shown
    if path == "-":
        shown += " (standard input)"
    try:
        if path != "-":
            raw = Path(path).read_bytes()
        elif (buffer := getattr(sys.stdin, "buffer", None)) is not None:
            raw = buffer.read()
        else:  # a text stream without bytes beneath it
            text = str(sys.stdin.read())
            if not _is_text(text):
                raise UserError(f"{option} {shown}: not UTF-8 text")
            return text
    except OSError as exc:
        raise UserError(f"{option} {shown}: {exc.strerror or exc}") from None
    try:
        return str(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise UserError(
            f"{option} {shown}: not UTF-8 text (byte {exc.start + 1}, on line {line},"
            f" is 0x{raw[exc.start]:02x})"
        ) from None


def _is_text(text: str) -> bool:
    """Whether ``text`` is Unicode text that UTF-8 can hold (no lone surrogate: Python reads bytes
    that are not UTF-8, in a command line or a file, as lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class RepeatedMember(ValueError):
    """A JSON object that names one member twice (``name``: the first such)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"the member {name!r} appears more than once in one object: give it once")
        self.name = name


def _members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An ``object_pairs_hook`` that refuses a repeated member name (`RepeatedMember`)."""
    seen: dict[str, Any] = {}
    for name, value in pairs:
        if name in seen:
            raise RepeatedMember(name)
        seen[name] = value
    return seen


class Unreadable(ValueError):
    """JSON the CLI does not decode: nested more than `MAX_JSON_DEPTH` levels deep, or holding an
    integer of more digits than Python reads (`sys.get_int_max_str_digits`). Its message follows what
    it is about: ``--payload is nested too deeply ...``, ``line 3 holds a number of ...``."""


MAX_JSON_DEPTH = 500
"""The deepest nesting of arrays and objects a JSON argument may have: deeper, it is refused before it
is decoded (the decoder would exhaust Python's recursion limit, at about 1000; the server takes at
most 64 levels in a payload in any case)."""
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


def _nested_deeper_than(text: str, limit: int) -> bool:
    """Whether the JSON ``text`` nests arrays and objects more than ``limit`` deep (brackets in its
    strings are not counted)."""
    if text.count("[") + text.count("{") <= limit:  # too few to nest that deep (the usual case)
        return False
    depth = 0
    for bracket in _BRACKET.finditer(_JSON_STRING.sub("", text)):
        depth += 1 if bracket.group() in "[{" else -1
        if depth > limit:
            return True
    return False


def _integer(digits: str) -> int:
    """A JSON integer's value (``parse_int``), or `Unreadable` when it has more digits than Python
    reads from text (4300 unless changed: ``int()`` refuses it with advice about ``sys``)."""
    try:
        return int(digits)
    except ValueError:
        raise Unreadable(f"holds a number of more than {sys.get_int_max_str_digits()} digits") from None


def loads(text: str) -> Any:
    """``text`` decoded as JSON, each member name at most once per object (`RepeatedMember`, a
    `ValueError`, otherwise). JSON leaves the meaning of a repeated name open and the HTTP API refuses
    it (400); decoded by ``json.loads`` alone it would quietly become its last value, so the CLI
    refuses it too, before sending anything. (The HTTP side's check, ``_wire.parse_json``, is not
    reused: importing that module would cost ``loom send`` the HTTP server's imports, starlette and
    trio, about 0.15 s.) JSON nested too deeply, or with a number of too many digits, is `Unreadable`
    (a `ValueError`), said in loom's words rather than the decoder's."""
    too_deep = f"is nested too deeply (more than {MAX_JSON_DEPTH} levels)"
    if _nested_deeper_than(text, MAX_JSON_DEPTH):
        raise Unreadable(too_deep)
    try:
        return json.loads(text, object_pairs_hook=_members, parse_int=_integer)
    except RecursionError:  # (only where the recursion limit is far lower than Python's own)
        raise Unreadable(too_deep) from None


def json_object(text: str | None, option: str) -> dict[str, Any]:
    """A JSON object argument (``@file`` or ``@-`` read it); ``None``: an empty one."""
    if text is None:
        return {}
    try:
        value = loads(read_argument(text, option))
    except RepeatedMember as exc:
        raise UserError(f"{option}: {exc}") from None
    except Unreadable as exc:
        raise UserError(f"{option} {exc}") from None
    except ValueError as exc:
        raise UserError(f"{option} must be a JSON object (or @file, or @- for stdin): {exc}") from None
    if not isinstance(value, dict):
        raise UserError(f"{option} must be a JSON object, got {type(value).__name__}")
    return value


EMPTY_DB = "--db is empty: give the path of a loom database"


def checked_config(path: Path | None) -> None:
    """Refuse (`UserError`, one line) a ``--config`` that names a directory, or anything else that is
    not a regular file (``/dev/null``), saying so: the configuration's finder would call it missing.
    A missing path is left for the finder to refuse."""
    if path is None:
        return
    try:
        mode = path.stat().st_mode
    except (OSError, ValueError):  # missing (or a name no file can have): the finder says so
        return
    if stat.S_ISDIR(mode):
        raise UserError(f"--config {path}: a directory, not a configuration file")
    if not stat.S_ISREG(mode):
        raise UserError(f"--config {path}: not a regular file (a configuration is a loom.toml file)")


def existing_loom_database(path: str) -> None:
    """Refuse (`UserError`, one line) a SQLite path that is not already a loom database, creating
    nothing beside it (`loom.store.not_a_loom_database` says why): a typo would otherwise pass for a
    store with nothing to report."""
    from ..store import not_a_loom_database

    if not path:  # (as a path, '' would be the working directory)
        raise UserError(EMPTY_DB)
    problem = not_a_loom_database(path)
    if problem is not None:
        raise UserError(problem)


def dump(answer: Any) -> None:
    typer.echo(json.dumps(answer, indent=2, sort_keys=True, ensure_ascii=False))


def show(answer: Any, as_json: bool) -> None:
    """An answer as JSON (``--json``), or as ``key  value`` lines for a person."""
    from ._render import block, humanize

    if as_json or not isinstance(answer, dict):
        dump(answer)
    else:
        typer.echo(block(humanize(answer)))


def pages(
    api: Client, path: str, params: Mapping[str, object | None], name: str, *, limit: int, every: bool
) -> Iterator[tuple[list[Any], Any]]:
    """The pages of a list route: each page's items under ``name`` and its ``next_after`` cursor;
    with ``every`` it follows the cursor to the last page, otherwise it stops after the first."""
    after = params.get("after")
    while True:
        answer = api.get(path, {**params, "after": after, "limit": limit})
        items = answer.get(name) if isinstance(answer, dict) else None
        if not isinstance(items, list):
            raise UserError(f"the server answered {path} without a list of {name}")
        after = answer.get("next_after")
        yield items, after
        if not every or after is None:
            return


def list_command(
    api: Client,
    path: str,
    params: Mapping[str, object | None],
    name: str,
    *,
    limit: int,
    every: bool,
    as_json: bool,
    render: Callable[[list[Any]], str],
    empty: str,
) -> None:
    """Print a list route's items: a table per page for a person, or one JSON answer (``--json``:
    every item read, and ``next_after``). When more remain than were read, says how to read on."""
    collected: list[Any] = []
    after = None
    for items, cursor in pages(api, path, params, name, limit=limit, every=every):
        if not as_json and items:
            typer.echo(render(items))
        collected += items
        after = cursor
    if not as_json and not collected:
        typer.echo(empty)
    if as_json:
        dump({name: collected, "next_after": after})
    elif after is not None:
        from ._render import printable

        typer.echo(f"(more remain: --after {printable(after)} reads on, --all reads every page)", err=True)
