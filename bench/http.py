"""``loom serve`` over HTTP: durable acceptance through ``POST /events`` as a ratio to in-process
``rt.publish`` measured in the same run, request latency, and the web view's Work list with 10,000 Works
(bench/README.md).

Run from the repository root::

    python bench/http.py [--events N] [--clients C] [--works W] [--renders R] [--rounds K] [--dir DIR]
                         [--backend sqlite|postgres] [--url URL]

Figures, one line each:

* in-process acceptance: ``C`` trio tasks calling ``rt.publish`` (distinct root Events) on a fresh file;
* HTTP acceptance: ``loom serve`` as its own process on a fresh file, and ``C`` concurrent keep-alive
  HTTP/1.1 connections on loopback, each sending ``POST /events`` and waiting for its answer before
  the next; every answer is checked to be ``201``; p50 and p99 request latency as the client saw it;
* the same client against an empty Starlette handler on Hypercorn's trio worker: the ceiling of the
  HTTP stack itself on this machine, with the ratios HTTP / in-process, stack / in-process and
  HTTP / stack (same round, same disk), and against a bare ASGI callable on Hypercorn (no Starlette);
* the Work list page (``GET /ui/work``, 100 per page) of a server holding ``W`` Works: p50 and p99
  render time, over ``R`` requests for pages from random points of the list, one at a time.

With ``--backend postgres`` the in-process runtime and ``loom serve`` run on fresh databases on the
server (bench/backend.py), and every figure also gets a raw psycopg baseline measured in the same round:
acceptance rates as ratios to raw commit-per-row and batched inserts, latencies in raw commits (how
many commit-per-row transactions take as long), and the page render as a ratio to the page's query
alone (``SELECT ... FROM works WHERE id > ? ORDER BY id LIMIT 100`` through psycopg).

The load generator is a minimal HTTP/1.1 client on trio sockets (request bytes written out, the
response's status line and Content-Length read back), so the client costs little of the CPU the server
shares with it. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

import backend
import pg
import trio

import loom
from loom.testing import raw

RAW_ROWS = 1_000  # at most, for the raw commit-per-row baseline on PostgreSQL
RAW_BATCH = 500

CREATE_WORK = """
[[scopes.bench.routes]]
name = "items"
types = ["bench.*"]
create_work = true
"""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def event_body(i: int, *, key: bool = False) -> dict[str, object]:
    body: dict[str, object] = {
        "source": "bench",
        "delivery_id": f"d-{i}",
        "type": "bench.event",
        "scope": "bench",
        "payload": {"n": i},
    }
    if key:
        body["key"] = f"item/{i:06d}"
    return body


# -- in process ---------------------------------------------------------------------------------------


async def in_process(location: str, events: int, producers: int) -> float:
    async with loom.open_runtime(location, clock=loom.SystemClock(), load_entry_points=False) as rt:

        async def produce(first: int) -> None:
            for i in range(first, events, producers):
                body = event_body(i)
                accepted = await rt.publish(loom.EventIn(**body))  # type: ignore[arg-type]
                assert not accepted.duplicate

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for p in range(producers):
                nursery.start_soon(produce, p)
        return events / (time.perf_counter() - start)


# -- a server process and a lean HTTP/1.1 client -------------------------------------------------------


class Server:
    def __init__(self, db: str, config: Path | None = None) -> None:
        args = [sys.executable, "-m", "loom", "serve", "--db", db, "--listen", "127.0.0.1:0"]
        args += ["--log-level", "warning"]
        if config is not None:
            args += ["--config", str(config)]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "listening on " not in line:
            self.proc.kill()
            raise SystemExit(f"loom serve did not start: {line!r}")
        url = line.split("listening on ", 1)[1].split()[0].rstrip(",")
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.host, self.port = host, int(port)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


EMPTY_APP = """
import sys, trio, hypercorn.trio
from hypercorn.config import Config
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

async def accept(request):
    await request.body()
    return Response(b'{}', status_code=201, media_type="application/json")

async def main():
    config = Config()
    config.bind = ["127.0.0.1:0"]
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(hypercorn.trio.serve, Starlette(routes=[Route("/events", accept, methods=["POST"])]), config)
        print("empty app: listening on", urls[0], flush=True)

trio.run(main)
"""


BARE_APP = """
import trio, hypercorn.trio
from hypercorn.config import Config

async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    headers = [(b"content-type", b"application/json"), (b"content-length", b"2")]
    await send({"type": "http.response.start", "status": 201, "headers": headers})
    await send({"type": "http.response.body", "body": b"{}"})

async def main():
    config = Config()
    config.bind = ["127.0.0.1:0"]
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(hypercorn.trio.serve, app, config)
        print("bare app: listening on", urls[0], flush=True)

trio.run(main)
"""


class EmptyApp(Server):
    """The ceiling of the stack itself: Starlette on Hypercorn's trio worker, answering 201 at once
    (``bare``: a bare ASGI callable on Hypercorn, without Starlette)."""

    def __init__(self, *, bare: bool = False) -> None:  # (no super: a process of its own, found the same way)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", BARE_APP if bare else EMPTY_APP],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        url = line.split("listening on ", 1)[1].split()[0]
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.host, self.port = host, int(port)


class Connection:
    """One keep-alive HTTP/1.1 connection: a request, then its whole response, then the next."""

    def __init__(self, stream: trio.SocketStream, host: str) -> None:
        self.stream = stream
        self.host = host
        self.buffer = b""

    @classmethod
    async def open(cls, host: str, port: int) -> Connection:
        return cls(await trio.open_tcp_stream(host, port), host)

    async def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        await self.stream.send_all(head.encode() + b"\r\n" + (body or b""))
        while b"\r\n\r\n" not in self.buffer:
            await self._more()
        raw_head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        lines = raw_head.split(b"\r\n")
        status = int(lines[0].split()[1])
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(self.buffer) < length:
            await self._more()
        content, self.buffer = self.buffer[:length], self.buffer[length:]
        return status, content

    async def _more(self) -> None:
        data = await self.stream.receive_some(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        self.buffer += data

    async def aclose(self) -> None:
        await self.stream.aclose()


async def over_http(server: Server, events: int, clients: int) -> tuple[float, list[float]]:
    connections = [await Connection.open(server.host, server.port) for _ in range(clients)]
    latencies: list[float] = []

    async def client(c: int) -> None:
        conn = connections[c]
        for i in range(c, events, clients):
            body = json.dumps(event_body(i)).encode()
            sent = time.perf_counter()
            status, content = await conn.request("POST", "/events", body)
            latencies.append(time.perf_counter() - sent)
            assert status == 201, (status, content[:200])

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for c in range(clients):
            nursery.start_soon(client, c)
    elapsed = time.perf_counter() - start
    for conn in connections:
        await conn.aclose()
    return events / elapsed, latencies


BATCH = 100
"""Events per request in the batch round (``POST /events`` with a JSON array)."""


async def batches_over_http(server: Server, events: int, clients: int) -> float:
    """``clients`` keep-alive connections, each sending batches of `BATCH` Events (every item answered
    201): the ingestion rate a sender with many Events at hand reaches."""
    connections = [await Connection.open(server.host, server.port) for _ in range(clients)]
    batches = [list(range(first, min(first + BATCH, events))) for first in range(0, events, BATCH)]

    async def client(c: int) -> None:
        conn = connections[c]
        for b in range(c, len(batches), clients):
            body = json.dumps([event_body(events + i) for i in batches[b]]).encode()
            status, content = await conn.request("POST", "/events", body)
            answer = json.loads(content)
            assert status == 200, (status, content[:200])
            assert answer["accepted"] == len(batches[b]), content[:200]

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for c in range(clients):
            nursery.start_soon(client, c)
    elapsed = time.perf_counter() - start
    for conn in connections:
        await conn.aclose()
    return events / elapsed


def stored(db: str) -> int:
    (row,) = raw.query(db, "SELECT count(*) AS n FROM events")
    return int(row["n"])


# -- the web view ----------------------------------------------------------------------------------------


async def fill(db: str, works: int) -> list[str]:
    """``works`` Works (one Event each, routed by a create_work route), built in process."""
    config = loom.Config.from_toml(CREATE_WORK)
    async with loom.open_runtime(db, clock=loom.SystemClock(), config=config, load_entry_points=False) as rt:

        async def produce(first: int) -> None:
            for i in range(first, works, 100):
                await rt.publish(loom.EventIn(**event_body(i, key=True)))  # type: ignore[arg-type]

        async with trio.open_nursery() as nursery:
            for p in range(100):
                nursery.start_soon(produce, p)
        await rt.wait_idle()
        ids: list[str] = []
        while page := await rt.works(after_id=ids[-1] if ids else "", limit=10_000):
            ids += [w.id for w in page]
        assert len(ids) == works, f"expected {works} Works, found {len(ids)}"
        return ids


async def renders(server: Server, ids: list[str], count: int, rng: random.Random) -> list[float]:
    conn = await Connection.open(server.host, server.port)
    times: list[float] = []
    try:
        for n in range(count):
            after = "" if n == 0 else rng.choice(ids[:-100])
            path = "/ui/work" + (f"?after={after}" if after else "")
            start = time.perf_counter()
            status, content = await conn.request("GET", path)
            times.append(time.perf_counter() - start)
            assert status == 200, (status, content[:200])
            assert content.count(b'<a class="id" href="/ui/work/') == 100, "a full page of 100 Works"
    finally:
        await conn.aclose()
    return times


def raw_page_queries(db: str, ids: list[str], count: int, rng: random.Random) -> list[float]:
    """The page's Work rows alone, read through the driver from random points of the list as the
    renders are (the same seed gives the same points): the render's raw baseline on PostgreSQL."""
    conn = backend.RawConnection(db)
    times: list[float] = []
    try:
        for n in range(count):
            after = "" if n == 0 else rng.choice(ids[:-100])
            start = time.perf_counter()
            rows = conn.execute("SELECT * FROM works WHERE id > ? ORDER BY id LIMIT 100", (after,))
            times.append(time.perf_counter() - start)
            assert len(rows) == 100, "a full page of 100 Works"
    finally:
        conn.close()
    return times


# -- main ---------------------------------------------------------------------------------------------


def spread(values: list[float], fmt: str) -> str:
    middle = format(statistics.median(values), fmt)
    if len(values) == 1:
        return middle
    return f"{middle} (rounds: {format(min(values), fmt)} to {format(max(values), fmt)})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000, help="events per acceptance figure (10000)")
    parser.add_argument("--clients", type=int, default=100, help="concurrent producers and connections (100)")
    parser.add_argument("--works", type=int, default=10_000, help="Works behind the web view (10000)")
    parser.add_argument("--renders", type=int, default=100, help="Work list pages requested (100)")
    parser.add_argument("--rounds", type=int, default=3, help="acceptance rounds; medians reported (3)")
    parser.add_argument("--dir", default=None, help="put the temporary databases here (the disk under test)")
    parser.add_argument("--seed", type=int, default=1)
    backend.add_options(parser)
    args = parser.parse_args(argv)
    backend.check_options(parser, args)
    if args.events < args.clients or args.clients < 1 or args.works < 200 or args.renders < 1:
        parser.error("--events must be at least --clients (>= 1), --works at least 200, --renders at least 1")

    with backend.chosen(args, "loom-bench-http-") as run:
        report(run, args)
    return 0


def report(run: backend.Backend, args: argparse.Namespace) -> None:
    """Measure every round, then the web view, and print the figures."""
    if run.postgres:
        print(
            f"# {sys.platform}, python {sys.version.split()[0]}, {run.server()}, {os.cpu_count()} cpus, "
            f"{args.rounds} rounds, a fresh database per figure; baseline: raw psycopg measured in each round",
            flush=True,
        )
    else:
        print(
            f"# {sys.platform}, python {sys.version.split()[0]}, sqlite {sqlite3.sqlite_version}, "
            f"{os.cpu_count()} cpus, {args.rounds} rounds, databases in {run.tmp}",
            flush=True,
        )
    local: list[float] = []
    http: list[float] = []
    batched: list[float] = []
    p50: list[float] = []
    p99: list[float] = []
    empty: list[float] = []
    bare: list[float] = []
    raw_row: list[float] = []  # PostgreSQL only: raw psycopg commit-per-row and batched inserts
    raw_batch: list[float] = []
    raw_rows = min(args.events, RAW_ROWS)
    for n in range(args.rounds):
        if run.cluster is not None:
            raw_row.append(pg.raw_commit_per_row(run.cluster.create_database(), raw_rows))
            raw_batch.append(pg.raw_batched(run.cluster.create_database(), args.events, RAW_BATCH))
        local.append(trio.run(in_process, run.location(f"local-{n}.db"), args.events, args.clients))
        for rates, is_bare in ((empty, False), (bare, True)):
            ceiling = EmptyApp(bare=is_bare)
            try:
                rates.append(trio.run(over_http, ceiling, args.events, args.clients)[0])
            finally:
                ceiling.stop()
        db = run.location(f"http-{n}.db")
        server = Server(db)
        try:
            rate, latencies = trio.run(over_http, server, args.events, args.clients)
        finally:
            server.stop()
        assert stored(db) == args.events, "every acknowledged Event stored once"
        http.append(rate)
        db = run.location(f"batch-{n}.db")
        server = Server(db)
        try:
            batched.append(trio.run(batches_over_http, server, args.events, args.clients))
        finally:
            server.stop()
        assert stored(db) == args.events, "every acknowledged Event of the batches stored once"
        p50.append(percentile(latencies, 0.50) * 1000)
        p99.append(percentile(latencies, 0.99) * 1000)
    rate_fmt = ",.0f"
    if raw_row:
        print(
            f"raw psycopg commit-per-row inserts: {spread(raw_row, rate_fmt)} rows/s ({raw_rows:,} rows); "
            f"batched, {RAW_BATCH} rows per commit: {spread(raw_batch, rate_fmt)} rows/s ({args.events:,} rows)"
        )
    print(
        f"in-process rt.publish, {args.clients} producers: {spread(local, rate_fmt)} events/s "
        f"({args.events:,} events)"
    )
    print(
        f"POST /events, {args.clients} keep-alive connections on loopback: {spread(http, rate_fmt)} events/s "
        f"({args.events:,} events, each answered 201)"
    )
    print(f"POST /events latency p50: {spread(p50, '.1f')} ms, p99: {spread(p99, '.1f')} ms")
    print(
        f"POST /events with batches of {BATCH} (a JSON array), {args.clients} connections: "
        f"{spread(batched, rate_fmt)} events/s"
    )
    print(
        f"ratio batched-http/in-process: {spread([b / p for b, p in zip(batched, local, strict=True)], '.2f')}"
    )
    print(
        f"the stack alone (an empty Starlette handler on Hypercorn's trio worker, same client): "
        f"{spread(empty, rate_fmt)} requests/s"
    )
    print(f"ratio http/in-process: {spread([h / p for h, p in zip(http, local, strict=True)], '.2f')}")
    print(
        f"ratio empty-stack/in-process: {spread([e / p for e, p in zip(empty, local, strict=True)], '.2f')}"
    )
    print(f"ratio http/empty-stack: {spread([h / e for h, e in zip(http, empty, strict=True)], '.2f')}")
    print(
        f"a bare ASGI callable on Hypercorn (no Starlette, same client): {spread(bare, rate_fmt)} requests/s; "
        f"ratio bare-stack/in-process: {spread([b / p for b, p in zip(bare, local, strict=True)], '.2f')}"
    )
    if raw_row:
        for name, rates in (("in-process", local), ("http", http)):
            print(
                f"ratio {name}/raw-commit-per-row: "
                f"{spread([r / w for r, w in zip(rates, raw_row, strict=True)], '.2f')}; "
                f"ratio {name}/raw-batched: {spread([r / w for r, w in zip(rates, raw_batch, strict=True)], '.3f')}"
            )
        # how many raw commit-per-row transactions take as long as one request
        print(
            "POST /events latency in raw psycopg commits: "
            f"p50 {spread([ms / 1000 * w for ms, w in zip(p50, raw_row, strict=True)], '.1f')}, "
            f"p99 {spread([ms / 1000 * w for ms, w in zip(p99, raw_row, strict=True)], '.1f')}"
        )

    db = run.location("web.db")
    ids = trio.run(fill, db, args.works)
    config = run.tmp / "loom.toml"
    config.write_text(CREATE_WORK)
    server = Server(db, config)
    try:
        times = trio.run(renders, server, ids, args.renders, random.Random(args.seed))
    finally:
        server.stop()
    page = ""
    if run.postgres:
        queries = raw_page_queries(db, ids, args.renders, random.Random(args.seed))
        page = (
            f"; raw psycopg page query alone: p50 {percentile(queries, 0.50) * 1000:.2f} ms, ratio of p50s "
            f"{percentile(times, 0.50) / percentile(queries, 0.50):.1f}"
        )
    print(
        f"GET /ui/work (100 per page) with {args.works:,} Works: render p50 "
        f"{percentile(times, 0.50) * 1000:.1f} ms, p99 {percentile(times, 0.99) * 1000:.1f} ms "
        f"({args.renders} pages from random points of the list){page}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
