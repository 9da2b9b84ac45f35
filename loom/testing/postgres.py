"""A throwaway PostgreSQL server for tests, drills and benchmarks.

`PostgresCluster.start()` makes a cluster with ``initdb`` in a temporary directory, runs it as an
unprivileged user when started as root (PostgreSQL refuses root), listening only on a unix socket in
that directory under a private port number, and `stop` removes it all. A guard process started with
it stops the server and removes its files when the process that started it ends without calling
`stop` (killed, or out through ``os._exit``), so a failed or hung test run leaves no server behind.
`PostgresCluster.external`
uses a server someone else runs instead (``LOOM_TEST_POSTGRES_URL``). Either way, `create_database`
makes a fresh database per test, copied from a migrated template (fast: no migrations per test).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import quote, urlencode

import attrs

from ..store._open import postgres_backend

ENV_URL = "LOOM_TEST_POSTGRES_URL"
ENV_BIN = "LOOM_POSTGRES_BIN"
DEBIAN_DIR = Path("/usr/lib/postgresql")
"""Where Debian's packages install each major version's server binaries (``<version>/bin``)."""
TEMPLATE = "loom_template"

TEST_SETTINGS = {
    # a test cluster: losing it in a power cut loses nothing anyone needs; a server restart (what
    # the tests do) still keeps every commit
    "fsync": "off",
    "full_page_writes": "off",
    "synchronous_commit": "on",
    "deadlock_timeout": "50ms",
    "max_connections": "300",
    "shared_buffers": "64MB",
    "listen_addresses": "''",
}
DURABLE_SETTINGS = {**TEST_SETTINGS, "fsync": "on", "full_page_writes": "on"}


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server could be started or reached."""


GUARD_MARK = "loom-postgres-guard"
"""The guard process's first argument: a test harness tells it from a process a test left behind."""

_GUARD = """
import os, shutil, subprocess, sys
_, _mark, root, data, *stop = sys.argv
sys.stdin.buffer.read()  # returns once the harness closes its end: by stop(), or by ending
if os.path.exists(os.path.join(data, "postmaster.pid")):
    subprocess.run(stop, cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
shutil.rmtree(root, ignore_errors=True)
"""
"""The guard: it waits for end of file on its standard input, a pipe only the harness's process holds
open, then stops the server (fast: ``immediate``) if it still runs and removes the cluster's files."""


def find_bin_dir() -> Path | None:
    """Where ``initdb`` and ``pg_ctl`` are: ``LOOM_POSTGRES_BIN``, the newest Debian install, or PATH."""
    candidates: list[Path] = []
    if os.environ.get(ENV_BIN):
        candidates.append(Path(os.environ[ENV_BIN]))
    debian = DEBIAN_DIR
    if debian.is_dir():
        versions = sorted(
            (p for p in debian.iterdir() if p.name.isdigit()), key=lambda p: int(p.name), reverse=True
        )
        candidates += [p / "bin" for p in versions]
    found = shutil.which("initdb")
    if found:
        candidates.append(Path(found).parent)
    for candidate in candidates:
        if (candidate / "initdb").exists() and (candidate / "pg_ctl").exists():
            return candidate
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@attrs.define
class PostgresCluster:
    """A PostgreSQL server and how to reach it (``host`` is a socket directory or a host name)."""

    host: str
    port: int
    user: str
    password: str | None = None
    base_dbname: str = "postgres"
    data_dir: Path | None = None
    bin_dir: Path | None = None
    run_as: str | None = None
    _root: Path | None = None
    _owned: list[str] = attrs.field(factory=list)
    _template: str | None = None
    _guard: subprocess.Popen[bytes] | None = None

    # -- starting and stopping ------------------------------------------------

    @classmethod
    def start(cls, *, settings: dict[str, str] | None = None, bin_dir: Path | None = None) -> PostgresCluster:
        """initdb a new cluster in a temporary directory and start it (raises `PostgresUnavailable`)."""
        bin_dir = bin_dir or find_bin_dir()
        if bin_dir is None:
            raise PostgresUnavailable("no PostgreSQL server binaries (initdb, pg_ctl) were found")
        run_as = "nobody" if os.geteuid() == 0 else None
        root = Path(tempfile.mkdtemp(prefix="loom-pg-"))
        data = root / "data"
        port = _free_port()
        cluster = cls(
            host=str(root), port=port, user="loom", data_dir=data, bin_dir=bin_dir, run_as=run_as, root=root
        )
        if run_as is not None:
            entry = pwd.getpwnam(run_as)
            os.chown(root, entry.pw_uid, entry.pw_gid)
        root.chmod(0o755)
        try:
            cluster._run("initdb", "-D", str(data), "-U", "loom", "--auth=trust", "-E", "UTF8", "--locale=C")
            conf = {**(settings or TEST_SETTINGS), "port": str(port), "unix_socket_directories": f"'{root}'"}
            with (data / "postgresql.conf").open("a") as f:
                for key, value in conf.items():
                    f.write(f"{key} = {value}\n")
            cluster._guard = cluster._start_guard()
            cluster._run("pg_ctl", "-D", str(data), "-l", str(root / "server.log"), "-w", "-t", "60", "start")
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _start_guard(self) -> subprocess.Popen[bytes]:
        """Start the guard (see `_GUARD`) before the server: in a session of its own, so a Ctrl-C
        aimed at the test run does not stop it before it has done its work."""
        assert self.data_dir is not None
        assert self._root is not None
        stop = self._command("pg_ctl", "-D", str(self.data_dir), "-m", "immediate", "-w", "stop")
        return subprocess.Popen(
            [sys.executable, "-c", _GUARD, GUARD_MARK, str(self._root), str(self.data_dir), *stop],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd="/",
            start_new_session=True,
        )

    @property
    def guard_pid(self) -> int | None:
        """The guard process's id (``None``: no guard, the server is not this harness's)."""
        return self._guard.pid if self._guard is not None else None

    @classmethod
    def external(cls, url: str) -> PostgresCluster:
        """A server someone else runs (the databases this makes are dropped by `stop`)."""
        from psycopg import conninfo

        parts = conninfo.conninfo_to_dict(url)
        return cls(
            host=str(parts.get("host", "localhost")),
            port=int(parts.get("port", 5432) or 5432),
            user=str(parts.get("user") or os.environ.get("USER", "postgres")),
            password=str(parts["password"]) if parts.get("password") else None,
            base_dbname=str(parts.get("dbname") or "postgres"),
        )

    def _command(self, tool: str, *args: str) -> list[str]:
        assert self.bin_dir is not None
        cmd = [str(self.bin_dir / tool), *args]
        if self.run_as is not None:
            cmd = ["runuser", "-u", self.run_as, "--", *cmd]
        return cmd

    def _run(self, tool: str, *args: str) -> None:
        cmd = self._command(tool, *args)
        done = subprocess.run(cmd, capture_output=True, text=True, cwd="/", check=False)
        if done.returncode != 0:
            raise PostgresUnavailable(
                f"{tool} failed ({done.returncode}): {done.stderr.strip() or done.stdout}"
            )

    def restart(self) -> None:
        """Stop the server (fast: connections are cut) and start it again, as a database restart does."""
        assert self.data_dir is not None, "only a cluster this harness started can be restarted"
        self._run("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "stop")
        self._run("pg_ctl", "-D", str(self.data_dir), "-l", str(self.host) + "/server.log", "-w", "start")

    def stop(self) -> None:
        """Stop a cluster this harness started and remove its files; drop the databases made on an
        external server."""
        if self.data_dir is not None:
            if (self.data_dir / "postmaster.pid").exists():
                try:
                    self._run("pg_ctl", "-D", str(self.data_dir), "-m", "immediate", "-w", "stop")
                except PostgresUnavailable:
                    pass  # already gone
            if self._root is not None:
                shutil.rmtree(self._root, ignore_errors=True)
            if self._guard is not None:
                guard, self._guard = self._guard, None
                assert guard.stdin is not None
                guard.stdin.close()  # nothing is left for it to do: it ends
                guard.wait()
            return
        for name in self._owned:
            try:
                self._execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            except Exception:
                pass  # the server went away: nothing of ours is left to drop
        self._owned.clear()

    # -- databases --------------------------------------------------------------

    def url(self, dbname: str | None = None) -> str:
        """A ``postgresql://`` URL of ``dbname`` (default: the server's base database)."""
        auth = quote(self.user, safe="") + (f":{quote(self.password, safe='')}" if self.password else "")
        db = quote(dbname or self.base_dbname, safe="")
        if self.host.startswith("/"):  # a socket directory
            return f"postgresql://{auth}@/{db}?{urlencode({'host': self.host, 'port': self.port})}"
        return f"postgresql://{auth}@{self.host}:{self.port}/{db}"

    def _execute(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(sql.encode())

    def terminate(self, dbname: str, application_name: str | None = None) -> int:
        """Cut the server's connections to ``dbname`` (those of ``application_name`` only, if given)
        as an administrator or a crashed backend would; return how many were cut."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()"
                " AND (%s::text IS NULL OR application_name = %s::text)",
                (dbname, application_name, application_name),
            ).fetchone()
        return int(row[0]) if row else 0

    def create_database(self, name: str | None = None, *, template: str | None = None) -> str:
        """Make a fresh database (a copy of ``template`` if given); return its URL."""
        name = name or f"loom_{uuid.uuid4().hex[:12]}"
        clause = f' TEMPLATE "{template}"' if template else ""
        self._execute(f'CREATE DATABASE "{name}"{clause}')
        self._owned.append(name)
        return self.url(name)

    def migrated_template(self) -> str:
        """The name of a database with loom's schema, to copy per test (made once per cluster)."""
        if self._template is None:
            name = f"{TEMPLATE}_{uuid.uuid4().hex[:8]}"
            postgres_backend().PostgresStore(url=self.create_database(name)).open_writer().close()
            self._template = name
        return self._template

    def wait_ready(self, deadline_s: float = 30.0) -> None:
        """Poll until the server accepts connections (a real server starting: polled, with a deadline)."""
        import psycopg

        end = time.monotonic() + deadline_s
        while True:
            try:
                with psycopg.connect(self.url(), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > end:
                    raise
                time.sleep(0.05)
