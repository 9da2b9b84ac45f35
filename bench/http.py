"""``loom serve`` over HTTP: durable acceptance through ``POST /events`` as a ratio to in-process
``rt.publish`` measured in the same run, request latency, and the web view's Work list with 10,000 Works
(bench/README.md).

Run from the repository root::

    python bench/http.py [--events N] [--clients C] [--works W] [--renders R] [--rounds K] [--dir DIR]

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

The load generator is a minimal HTTP/1.1 client on trio sockets (request bytes written out, the
response's status line and Content-Length read back), so the client costs little of the CPU the server
shares with it. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

import loom

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


async def in_process(path: Path, events: int, producers: int) -> float:
    async with loom.open_runtime(str(path), clock=loom.SystemClock(), load_entry_points=False) as rt:

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
    def __init__(self, db: Path, config: Path | None = None) -> None:
        args = [sys.executable, "-m", "loom", "serve", "--db", str(db), "--listen", "127.0.0.1:0"]
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


def stored(db: Path) -> int:
    conn = sqlite3.connect(db)
    try:
        return int(conn.execute("SELECT count(*) FROM events").fetchone()[0])
    finally:
        conn.close()


# -- the web view ----------------------------------------------------------------------------------------


async def fill(db: Path, works: int) -> list[str]:
    """``works`` Works (one Event each, routed by a create_work route), built in process."""
    config = loom.Config.from_toml(CREATE_WORK)
    async with loom.open_runtime(
        str(db), clock=loom.SystemClock(), config=config, load_entry_points=False
    ) as rt:

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
    args = parser.parse_args(argv)
    if args.events < args.clients or args.clients < 1 or args.works < 200 or args.renders < 1:
        parser.error("--events must be at least --clients (>= 1), --works at least 200, --renders at least 1")

    tmp = Path(tempfile.mkdtemp(prefix="loom-bench-http-", dir=args.dir))
    try:
        print(
            f"# {sys.platform}, python {sys.version.split()[0]}, sqlite {sqlite3.sqlite_version}, "
            f"{os.cpu_count()} cpus, {args.rounds} rounds, databases in {tmp}",
            flush=True,
        )
        local, http, p50, p99, empty, bare = [], [], [], [], [], []
        for n in range(args.rounds):
            local.append(trio.run(in_process, tmp / f"local-{n}.db", args.events, args.clients))
            for rates, is_bare in ((empty, False), (bare, True)):
                ceiling = EmptyApp(bare=is_bare)
                try:
                    rates.append(trio.run(over_http, ceiling, args.events, args.clients)[0])
                finally:
                    ceiling.stop()
            server = Server(tmp / f"http-{n}.db")
            try:
                rate, latencies = trio.run(over_http, server, args.events, args.clients)
            finally:
                server.stop()
            assert stored(tmp / f"http-{n}.db") == args.events, "every acknowledged Event stored once"
            http.append(rate)
            p50.append(percentile(latencies, 0.50) * 1000)
            p99.append(percentile(latencies, 0.99) * 1000)
        rate_fmt = ",.0f"
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

        db = tmp / "web.db"
        ids = trio.run(fill, db, args.works)
        config = tmp / "loom.toml"
        config.write_text(CREATE_WORK)
        server = Server(db, config)
        try:
            times = trio.run(renders, server, ids, args.renders, random.Random(args.seed))
        finally:
            server.stop()
        print(
            f"GET /ui/work (100 per page) with {args.works:,} Works: render p50 "
            f"{percentile(times, 0.50) * 1000:.1f} ms, p99 {percentile(times, 0.99) * 1000:.1f} ms "
            f"({args.renders} pages from random points of the list)"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
