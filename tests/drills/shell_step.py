"""One attempt of a kill drill's waiter or schedule Work, run by the shell executor of ``loom serve``.

A schedule occurrence, or a waiter whose wait was already woken (or whose attempt was handed the
wake), is done: exit 0. Otherwise it parks the attempt on a ``drill.wake`` wait through the HTTP
toolbelt with its bearer token, and exits 0 once the server answered (3 if it could not reach it:
the server was killed; the attempt is then recovered and retried).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request

WAKE = "drill.wake"


def call(method: str, path: str, body: object | None = None, token: str | None = None) -> object:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(os.environ["LOOM_URL"] + path, data=data, headers=headers, method=method)
    with urllib.request.urlopen(request, timeout=20) as response:
        return json.loads(response.read())


def main() -> int:
    with open(os.environ["LOOM_REQUEST"], encoding="utf-8") as file:
        request = json.load(file)
    events = ([request["trigger"]] if request["trigger"] else []) + request["inputs"]
    types = {event["type"] for event in events}
    if "drill.cron" in types or WAKE in types:
        return 0
    try:
        view = call("GET", f"/work/{request['work_id']}")
        assert isinstance(view, dict)
        if any(wait["state"] == "woken" for wait in view["waits"]):
            return 0
        call(
            "POST",
            f"/executions/{os.environ['LOOM_EXECUTION_ID']}/wait",
            {"types": [WAKE]},
            token=os.environ["LOOM_TOKEN"],
        )
    except OSError as exc:
        print(f"drill step: the server is gone: {exc}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
