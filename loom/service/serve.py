"""``loom serve``: the runtime and its HTTP service in one trio program (docs/operations.md).

`serve` opens the runtime (every actor) on an embedded SQLite file, created on first start (or on a
PostgreSQL database named by a ``postgresql://`` URL), and runs
the Starlette app on Hypercorn's trio worker in the same nursery. SIGINT or SIGTERM stops it cleanly:
the server stops accepting, the actors stop, and the runtime's clean close releases its leases, so a
restart recovers the attempts it was running at once and continues where it was.

With ``test_clock`` the runtime runs on a `ManualClock` that moves only through ``POST /debug/clock``:
it starts at the wall clock's time on a new store, each move is recorded in the store before it is
answered (`Runtime.mark_time`), and a restart continues at that time, so time neither runs backwards
nor jumps across a kill.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import TypeVar

import attrs
import hypercorn.trio
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.config import Sockets
from starlette.applications import Starlette

from ..config import Config
from ..plugins.app import App
from ..records.clock import ManualClock, SystemClock
from ..records.errors import InvalidRequest, LoomError, StorageError
from ..runtime import ACTORS, Runtime, open_runtime
from ..runtime._runtime import check_grace
from ._access import Access, is_loopback
from ._app import make_app
from ._apps import app_and_config, find_config
from ._logs import configure_logging
from ._metrics import Metrics
from ._token import read_token_file

__all__ = ["DEFAULT_LISTEN", "Service", "open_service", "parse_listen", "run_http", "serve"]

DEFAULT_LISTEN = "127.0.0.1:8440"
GRACEFUL_SECONDS = 5.0
"""How long a stop waits for requests in flight before it closes their connections."""
READ_TIMEOUT_S = 30.0
"""How long a connection may send nothing while a request (its headers or its body) is due: a
client that stalls is cut off, so stalled connections cannot use up the server's file descriptors."""
STOP_GRACE_S = 8.0
"""How long a stopping server waits for its running python functions to return (`Runtime.drain`)."""

log = logging.getLogger("loom.service")


def parse_listen(listen: str) -> tuple[str, int]:
    """``host:port`` (``[::1]:8440`` for IPv6) as a host and a port (0: any free port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidRequest(
            f"listen must be host:port, like {DEFAULT_LISTEN}, got {listen!r}", field="listen"
        )
    return host.strip("[]"), int(port)


@attrs.define(kw_only=True)
class Service:
    """A running service: its runtime, its ASGI app and, under ``--test-clock``, the test clock."""

    runtime: Runtime
    app: Starlette
    clock: ManualClock | None
    _nursery: trio.Nursery

    async def start_actors(self) -> None:
        """Start every background actor (once), in the service's nursery."""
        for name in ACTORS:
            await self._nursery.start(self.runtime.run_actor, name)


@asynccontextmanager
async def open_service(
    db: str,
    *,
    config: Config | None = None,
    test_clock: ManualClock | bool = False,
    plugins: tuple[object, ...] = (),
    load_entry_points: bool = True,
    start_actors: bool = True,
    access: Access | None = None,
    stopping: trio.Event | None = None,
    node: str | None = None,
) -> AsyncIterator[Service]:
    """Open the runtime on ``db`` and the app over it (no HTTP listener: see `run_http`), with every
    actor running (``start_actors=False``: none yet, start them with `Service.start_actors`). Leaving
    the block stops the actors and closes the runtime cleanly.

    ``test_clock``: business time moves only through ``POST /debug/clock``. ``True`` runs on a clock
    of its own that starts where the store's time floor is (on a new store: at the wall clock's time);
    a `ManualClock` is used as it is, moved up to the floor if that is later. The start is recorded
    as the floor, so a restart continues at the same time. ``False``: the wall clock, and no
    ``/debug/clock``. ``access``: the host names served and the operator token (see `make_app`).
    ``stopping``: set when the server stops (long-polls then answer at once). ``node``: this server's
    node name on a shared database (see `open_runtime`)."""
    clock: ManualClock | None = None
    if isinstance(test_clock, ManualClock):
        clock = test_clock
    elif test_clock:
        clock = ManualClock(start_ms=0)  # moved to its start below, before anything runs
    async with open_runtime(
        db,
        clock=clock,
        config=config,
        plugins=plugins,
        load_entry_points=load_entry_points,
        actors=(),
        node=node,
    ) as rt:
        if clock is not None:
            # before anything commits or reads the time: nothing has run yet
            floor = await rt.time_floor()
            start = floor if floor is not None else SystemClock().now_ms() if test_clock is True else None
            if start is not None and start > clock.now_ms():
                clock.set(start)
            await rt.mark_time()
        metrics = Metrics()
        async with trio.open_nursery() as nursery:
            await nursery.start(metrics.run, rt)
            service = Service(
                runtime=rt,
                app=make_app(rt, metrics=metrics, clock=clock, access=access, stopping=stopping),
                clock=clock,
                nursery=nursery,
            )
            if start_actors:
                await service.start_actors()
            yield service
            nursery.cancel_scope.cancel()


def bound_socket(listen: str) -> socket.socket:
    """A TCP socket bound to ``listen`` (not yet listening); `InvalidRequest` naming ``listen`` when
    the address is taken or not this machine's."""
    host, port = parse_listen(listen)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise InvalidRequest(f"cannot listen on {listen}: {exc.strerror or exc}", field="listen") from None
    return sock


class _CloseOnExec(HypercornConfig):
    """Hypercorn's configuration, whose listening sockets are close-on-exec: Hypercorn makes them
    inheritable (for its worker processes, which loom does not use), and an inherited listening socket
    would keep the port bound by every process loom starts (a restarted server could not listen)."""

    def create_sockets(self) -> Sockets:
        sockets = super().create_sockets()
        for sock in (*sockets.secure_sockets, *sockets.insecure_sockets, *sockets.quic_sockets):
            sock.set_inheritable(False)
        return sockets


def hypercorn_config(sock: socket.socket, *, read_timeout: float = READ_TIMEOUT_S) -> HypercornConfig:
    """Hypercorn's configuration, serving on ``sock`` (which it takes over). Its access log is off:
    the app writes its own, one line per request (`_logs.AccessLog`)."""
    config = _CloseOnExec()
    config.bind = [f"fd://{sock.detach()}"]
    config.graceful_timeout = GRACEFUL_SECONDS
    config.read_timeout = read_timeout  # type: ignore[assignment]  # typed int, used as seconds
    config.accesslog = None
    config.errorlog = logging.getLogger("loom.service.http")
    return config


async def run_http(
    app: Starlette,
    listen: str = DEFAULT_LISTEN,
    *,
    shutdown: Callable[[], Awaitable[None]] | None = None,
    read_timeout: float = READ_TIMEOUT_S,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` with Hypercorn's trio worker until ``shutdown`` returns (or until cancelled);
    ``task_status`` reports the bound addresses (``http://127.0.0.1:43123`` for port 0). An address
    that cannot be bound is `InvalidRequest` naming ``listen``. A connection that sends nothing for
    ``read_timeout`` seconds while a request is due is closed. When ``shutdown`` returns, the open
    watch streams end at once (the requests in flight have `GRACEFUL_SECONDS` to finish)."""
    config = hypercorn_config(bound_socket(listen), read_timeout=read_timeout)
    stopping = None
    if shutdown is not None:
        trigger = shutdown

        async def stopping() -> None:
            await trigger()
            watches = getattr(app.state, "watches", None)
            if watches is not None:
                watches.end()

    await hypercorn.trio.serve(
        app,  # type: ignore[arg-type]  # Starlette is an ASGI 3 app; the scope types differ only in name
        config,
        shutdown_trigger=stopping,
        task_status=task_status,
    )


E = TypeVar("E", bound=BaseException)


def _leaves(group: BaseExceptionGroup[E]) -> list[E]:
    out: list[E] = []
    for exc in group.exceptions:
        out += _leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc]
    return out


async def serve(
    db: str | Path = "loom.db",
    config_path: str | Path | None = None,
    listen: str = DEFAULT_LISTEN,
    test_clock: bool = False,
    log_level: str | int = "info",
    *,
    log_format: str = "text",
    allow_hosts: Sequence[str] = (),
    token_file: str | Path | None = None,
    read_timeout: float = READ_TIMEOUT_S,
    app: str | None = None,
    node: str | None = None,
    stop_grace: float = STOP_GRACE_S,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``loom serve`` until SIGINT or SIGTERM: the runtime (every actor) on the SQLite file ``db``
    (created on first start) or the PostgreSQL database of a ``postgresql://`` URL, its configuration
    from ``config_path`` (``None``: ``$LOOM_CONFIG``, else ``./loom.toml``, else the app's, else none: the
    log says which), the `loom.App` ``app`` (``module:object``, or the configuration's ``app``) whose
    functions and executors it runs, and the HTTP API and web view on ``listen`` (loopback by default;
    port 0 picks a free port).

    Once listening it sets ``LOOM_URL`` in its environment to the address (the shell executor gives
    it to the processes it runs, beside their token), starts the actors, prints ``loom serve:
    listening on http://HOST:PORT`` on stdout and reports the addresses through ``task_status`` (for
    ``nursery.start``). ``test_clock`` runs the runtime on a
    clock that moves only through ``POST /debug/clock``. A bad argument raises `InvalidRequest` (a
    bad config file `ConfigError`) before anything is opened.

    Access (docs/http-api.md "Access"): requests must name a host the server serves (its loopback
    names; off loopback also its address and host name; ``allow_hosts`` adds names, ``*`` any), and
    with ``token_file`` every operator route needs the token it holds. ``node`` names this server on a
    shared database: restarted under the same name, it recovers its killed incarnation's attempts at
    once (on a SQLite file a restart always does). Off loopback the token is
    required: without one `serve` refuses to start. A connection that sends nothing for
    ``read_timeout`` seconds while a request is due is closed. Stopping, it waits up to
    ``stop_grace`` seconds for its running python functions to return (`Runtime.drain`).
    """
    configure_logging(log_level, log_format)
    host, _ = parse_listen(listen)
    if (
        isinstance(read_timeout, bool)
        or not isinstance(read_timeout, int | float)
        or not 0 < read_timeout <= 3600
    ):
        raise InvalidRequest(
            f"read_timeout must be seconds above 0, at most 3600, got {read_timeout!r}", field="read_timeout"
        )
    check_grace("stop_grace", stop_grace)
    token = read_token_file(token_file) if token_file is not None else None
    if token is None and not is_loopback(host):
        raise InvalidRequest(
            f"listen {listen} is not a loopback address: anyone who reaches it could read and control"
            " everything, so an operator token is required there (--token-file; docs/http-api.md#access)",
            field="token_file",
        )
    access = Access.for_listen(host, allow_hosts=allow_hosts, token=token)
    found = find_config(config_path)
    served, config, said = app_and_config(app, found)
    stop = trio.Event()
    try:
        await _serve(
            db,
            config,
            found.path,
            listen,
            test_clock,
            access,
            float(read_timeout),
            stop,
            float(stop_grace),
            task_status,
            said=said,
            app=served,
            node=node,
        )
    except BaseExceptionGroup as group:
        reason = _reason(group)
        if reason is None:
            raise
        raise reason from None
    log.info("stopped cleanly")


def _reason(group: BaseExceptionGroup[BaseException]) -> LoomError | None:
    """Why `serve` stopped, when only loom's own errors stopped it: one of its refusals (the address
    is taken, the store is too new) or the store's failure, which every actor meets at once (a full
    disk fails each of them): the store's failure first, said once. ``None`` for anything else (a
    fault in loom), which keeps its traceback."""
    leaves = _leaves(group)
    if not leaves or not all(isinstance(leaf, LoomError) for leaf in leaves):
        return None
    failures = [leaf for leaf in leaves if isinstance(leaf, StorageError)]
    first = failures[0] if failures else leaves[0]
    assert isinstance(first, LoomError)
    if len(leaves) > 1:
        log.debug("stopped by %d failures; the first: %s", len(leaves), first)
    return first


async def _serve(
    db: str | Path,
    config: Config | None,
    config_path: str | Path | None,
    listen: str,
    test_clock: bool,
    access: Access,
    read_timeout: float,
    stop: trio.Event,
    stop_grace: float,
    task_status: trio.TaskStatus[list[str]],
    *,
    said: str,
    app: App | None = None,
    node: str | None = None,
) -> None:
    async with trio.open_nursery() as signals:
        signals.start_soon(_stop_on_signal, stop)
        async with open_service(
            str(db),
            config=config,
            test_clock=test_clock,
            start_actors=False,
            access=access,
            stopping=stop,
            plugins=(app,) if app is not None else (),
            node=node,
        ) as service:
            # the listener stops first (finishing the requests in flight), then the actors and the store
            async with trio.open_nursery() as http:
                urls: list[str] = await http.start(
                    partial(
                        run_http,
                        service.app,
                        listen,
                        shutdown=stop.wait,
                        read_timeout=read_timeout,
                    )
                )
                # executors hand this address to the processes they run (the shell executor's
                # LOOM_URL), so they can call the toolbelt; the actors start once it is known
                os.environ["LOOM_URL"] = urls[0]
                await service.start_actors()
                rt = service.runtime
                # SIGHUP reloads from before the line that says the server is up (until its handler
                # is in place, the signal's default action ends the process)
                await signals.start(_reload_on_hangup, rt, config_path, config.app if config else None)
                note = " (test clock: POST /debug/clock moves it)" if test_clock else ""
                print(f"loom serve: listening on {', '.join(urls)}{note}", flush=True)
                log.info(
                    "store: %s (%s)",
                    _shown(str(db)),
                    rt.backend,
                )
                (log.info if config is not None else log.warning)("config: %s", said)
                if app is not None:
                    log.info("app: %s", app)
                log.info("plugins: %s", ", ".join(rt.plugin_names))
                for finding in await rt.check():
                    log.warning("configuration: %s", finding)
                log.info("listening on %s%s", ", ".join(urls), note)
                task_status.started(urls)
            # the listener has stopped; the runtime starts nothing more, and its python functions
            # return and commit (else the next start fails them, and their Works retry)
            await _drain(service.runtime, stop_grace)
        signals.cancel_scope.cancel()


async def _drain(rt: Runtime, grace_s: float) -> None:
    log.info("starting nothing more; waiting up to %g s for running functions to return", grace_s)
    left = await rt.drain(grace_s)
    if left:
        log.warning(
            "%d attempt(s) still running after %g s (--stop-grace): the next start fails them, and their"
            " Works retry",
            left,
            grace_s,
        )


def _shown(db: str) -> str:
    """A store's location without the password of its URL."""
    from urllib.parse import urlsplit

    parts = urlsplit(db)
    if parts.password is None:
        return db
    return db.replace(f":{parts.password}@", ":***@", 1)


async def _reload_on_hangup(
    rt: Runtime,
    config_path: str | Path | None,
    loaded_app: str | None,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """SIGHUP reads the configuration file again and makes it the next generation (`Runtime.reload`);
    a refused file is logged, naming file, key and reason, and the configuration in force stays.
    What is not in the file (the store, the address, the token) needs a restart to change. Started
    once its handler is in place."""
    with trio.open_signal_receiver(signal.SIGHUP) as hangups:
        task_status.started()
        async for _ in hangups:
            if config_path is None:
                log.warning(
                    "SIGHUP: no --config file to reload (the store, address and token need a restart)"
                )
                continue
            try:
                config = Config.load(str(config_path))
                rt.reload(config)
            except LoomError as exc:
                log.error(
                    "SIGHUP: %s was not reloaded, the configuration in force stays: %s", config_path, exc
                )
            else:
                log.info("SIGHUP: reloaded %s", config_path)
                if config.app != loaded_app:
                    log.warning(
                        "SIGHUP: app = %r in %s was %r at the start: an app is imported once, at the"
                        " start; restart the server to run another, or new code",
                        config.app,
                        config_path,
                        loaded_app,
                    )


async def _stop_on_signal(stop: trio.Event) -> None:
    """The first SIGINT or SIGTERM stops the service cleanly: it waits for what runs to stop (a plain
    ``def`` function in its worker thread cannot be interrupted: its return). A second one ends the
    process at once, as a ``kill -9`` would: every commit stands, and the next start recovers the
    attempts that were running (an exception could not do it, for trio waits for that thread)."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            name = signal.Signals(signum).name
            if stop.is_set():
                log.warning("%s again: stopping at once, without waiting for what still runs", name)
                logging.shutdown()
                os._exit(128 + signum)
            log.info("%s: stopping (send it again to stop at once)", name)
            stop.set()
