"""What ``loom serve`` runs: the configuration file it finds, and the `loom.App` it imports
(docs/configuration.md, "Finding the configuration"; docs/plugins.md, "Serving your Python code").

The configuration is the first of ``--config``, ``LOOM_CONFIG`` and ``./loom.toml`` (the log says which
was read, or that none was). The app is ``--app module:object`` or the configuration's
``app = "module:object"``: the module is imported from the working directory (or, for the
configuration's ``app``, the configuration file's directory) like any module on ``sys.path``, and the
object must be a `loom.App`. Anything wrong is one `InvalidRequest` naming what is wrong.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from ..config import Config
from ..plugins.app import App
from ..records.errors import InvalidRequest

ENV_CONFIG = "LOOM_CONFIG"
DEFAULT_CONFIG = "loom.toml"
_SPEC = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*\Z")


@attrs.frozen(kw_only=True)
class Found:
    """The configuration file to read (``None``: none) and how it was found, for the log."""

    path: Path | None
    how: str


def find_config(
    given: str | Path | None, *, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> Found:
    """The configuration file: ``given`` (``--config``), else ``$LOOM_CONFIG``, else ``./loom.toml`` if it
    exists, else none. A file named by ``--config`` or ``LOOM_CONFIG`` must exist."""
    env = os.environ if env is None else env
    cwd = Path.cwd() if cwd is None else cwd
    if given is not None:
        return Found(path=_existing(Path(given), "--config"), how="--config")
    named = env.get(ENV_CONFIG)
    if named:
        return Found(path=_existing(Path(named), ENV_CONFIG), how=ENV_CONFIG)
    local = cwd / DEFAULT_CONFIG
    if local.is_file():
        return Found(path=local, how=f"./{DEFAULT_CONFIG} in the working directory")
    return Found(path=None, how=f"no --config, no {ENV_CONFIG} and no ./{DEFAULT_CONFIG}")


def _existing(path: Path, what: str) -> Path:
    if path.is_dir():
        raise InvalidRequest(f"{what} {path}: a directory, not a configuration file", field="config")
    if not path.is_file():
        missing = not path.exists()
        raise InvalidRequest(
            f"{what} {path}: {'no such configuration file' if missing else 'not a regular file'}",
            field="config",
        )
    return path


def load_app(spec: str, *, search: Sequence[Path] = (), what: str = "--app") -> App:
    """Import ``module:object`` (``object`` may be dotted: ``module:holder.app``) and return it, checked
    to be a `loom.App`; ``search``: directories to import from, before ``sys.path``."""
    if not isinstance(spec, str) or not _SPEC.match(spec):
        raise InvalidRequest(
            f"{what} must be module:object, like tasks:app or my_pkg.service:app, got {spec!r}", field="app"
        )
    module_name, _, attribute = spec.partition(":")
    for directory in reversed(search):
        folder = str(directory.resolve())
        if folder not in sys.path:
            sys.path.insert(0, folder)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            where = ", ".join(str(d) for d in search) or "sys.path"
            raise InvalidRequest(
                f"{what} {spec}: no module named {exc.name!r} (looked in {where} and on sys.path)",
                field="app",
            ) from None
        raise InvalidRequest(
            f"{what} {spec}: importing {module_name!r} failed: {_described(exc)}", field="app"
        ) from None
    except Exception as exc:
        raise InvalidRequest(
            f"{what} {spec}: importing {module_name!r} failed: {_described(exc)}", field="app"
        ) from None
    except SystemExit as exc:  # (sys.exit at import: the app's own code, not a stop of loom's)
        raise InvalidRequest(
            f"{what} {spec}: importing {module_name!r} called sys.exit({exc.code!r})", field="app"
        ) from None
    found: object = module
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise InvalidRequest(f"{what} {spec}: module {module_name!r} has no {attribute!r}", field="app")
        found = getattr(found, part)
    if not isinstance(found, App):
        raise InvalidRequest(
            f"{what} {spec}: {attribute} is a {type(found).__name__}, not a loom.App (make it with app = loom.App())",
            field="app",
        )
    return found


def _described(exc: BaseException) -> str:
    """An import failure in one line: the error, and the line of the user's code it came from."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "importlib" not in f.filename]
    where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f" ({exc.filename}:{exc.lineno})"
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}{where}"


def app_and_config(app: str | None, config: Found) -> tuple[App | None, Config | None, str]:
    """The app to serve and the configuration to run: the file's (its ``app`` naming the app when
    ``app`` is not given), else the app's own `App.config`. The third item says which configuration,
    for the log."""
    loaded = Config.load(config.path) if config.path is not None else None
    spec, what, search = app, "--app", [Path.cwd()]
    if spec is None and loaded is not None and loaded.app is not None:
        assert config.path is not None
        spec, what = loaded.app, f"{config.path}: app"
        search = [Path.cwd(), config.path.parent]
    served = load_app(spec, search=search, what=what) if spec is not None else None
    if loaded is not None:
        assert config.path is not None
        return served, loaded, f"configuration {config.path} ({config.how})"
    if served is not None and served.config is not None:
        return served, served.config, f"the configuration of app {spec} ({config.how})"
    return served, None, f"no configuration ({config.how}): every Event will be unmatched"
