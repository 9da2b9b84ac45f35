"""Run loom as a service with examples/loom.toml, and talk to it with the `loom` command line.

Run it as it is:  python examples/service_walkthrough.py

It starts `loom serve --config examples/loom.toml` on a free port with a fresh SQLite file, sends
Events with `loom send`, follows the Work they created with `loom work list` and `loom work get`, holds
and releases it, lists timers and diagnostics, and stops the server with SIGTERM (a clean stop). Each
command it runs is printed first, so you can type the same ones against your own server.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

CONFIG = Path(__file__).resolve().parent / "loom.toml"
LOOM = [sys.executable, "-m", "loom"]


def loom(*args: str, url: str) -> str:
    """Run one `loom` command against the server, print it and what it printed."""
    print(f"$ loom {' '.join(args)}")
    done = subprocess.run([*LOOM, *args, "--url", url], capture_output=True, text=True, check=False)
    print((done.stdout + done.stderr).rstrip())
    print()
    if done.returncode != 0:
        raise SystemExit(f"`loom {args[0]}` failed")
    return done.stdout


def get(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=10) as response:  # the server is on this machine
        answer: dict[str, object] = json.loads(response.read())
        return answer


def settled(url: str, key: str) -> dict[str, object]:
    """The Work for ``key`` once its first attempt has ended (the server runs it by itself)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            work = get(f"{url}/work/by-key/{urllib.request.quote(key, safe='')}")["work"]
        except OSError:
            work = None
        if isinstance(work, dict) and work.get("attempts") and work.get("current_execution_id") is None:
            return work
        time.sleep(0.05)
    raise SystemExit(f"the Work for {key} did not finish its attempt")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "service.db")
        command = [*LOOM, "serve", "--db", db, "--config", str(CONFIG), "--listen", "127.0.0.1:0"]
        print(f"$ loom serve --db {db} --config examples/loom.toml --listen 127.0.0.1:0")
        server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            assert server.stdout is not None
            line = server.stdout.readline()  # "loom serve: listening on http://127.0.0.1:PORT"
            if "listening on " not in line:
                raise SystemExit("loom serve did not start")
            url = line.split("listening on ", 1)[1].strip()
            print(line.strip())
            print()

            print("# an Event creates Work for its key; a redelivery is recognised; a drop route records it")
            payload = json.dumps({"title": "the checkout page crashes"})
            loom("send", "issue.opened", "--scope", "acme/web", "--key", "issue/7", "--payload", payload,
                 "--delivery-id", "github-1001", url=url)  # fmt: skip
            loom("send", "issue.opened", "--scope", "acme/web", "--key", "issue/7", "--payload", payload,
                 "--delivery-id", "github-1001", url=url)  # fmt: skip
            loom("send", "deploy.finished", "--scope", "acme/web", url=url)
            settled(url, "issue/7")

            print("# an attempt that exits non-zero fails; the Work waits for its retry (5 minutes)")
            flaky = json.dumps({"title": "a flaky test in CI"})
            loom(
                "send", "issue.opened", "--scope", "acme/web", "--key", "issue/8", "--payload", flaky, url=url
            )
            work_id = str(settled(url, "issue/8")["id"])
            loom("work", "list", "--scope", "acme", url=url)
            loom("work", "get", work_id, url=url)

            print("# operator controls: hold it (no attempt starts), release it, or retry it now")
            loom("work", "hold", work_id, "--reason", "waiting for the on-call engineer", url=url)
            loom("work", "release", work_id, url=url)
            loom("timers", "list", "--state", "armed", url=url)
            loom("diagnostics", url=url)
        finally:
            server.send_signal(signal.SIGTERM)  # a clean stop: the server finishes and releases its leases
            server.wait(timeout=30)
            if server.stdout is not None:
                server.stdout.close()
        print(f"loom serve stopped with status {server.returncode}")


if __name__ == "__main__":
    main()
