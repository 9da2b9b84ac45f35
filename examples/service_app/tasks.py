"""A loom app: Python functions that ``loom serve`` runs, and the same object embedded.

Serve it (the server reads ./loom.toml, which names this app):

    cd examples/service_app && loom serve --db shop.db
    loom send order.placed --scope shop --key order/1 --payload '{"items": [{"sku": "A", "qty": 2, "price": 5}]}'
    loom work wait <the work id loom send printed>      # work ... completed: {"items": 1, "total": 10}

or name the app yourself: ``loom serve --app tasks:app --config loom.toml``. Embedded, the same object
is a plugin: ``open_runtime("shop.db", config=..., plugins=[app])`` (see ``embedded.py`` beside it).
"""

from __future__ import annotations

from typing import Any

import loom

app = loom.App()


@app.function("price")
async def price(request: loom.RunRequest, toolbelt: loom.Toolbelt) -> dict[str, Any]:
    """Price an order: the attempt completes with the total as its result, which ``loom work wait``,
    ``GET /work/{id}/result`` and ``Runtime.wait_for`` hand back. A bad order raises: the attempt fails
    with the reason, and its retry policy applies (``loom work get`` shows the error and the backoff)."""
    order = request.origin or request.trigger  # a retry's trigger is core.retry.due; origin, the order
    assert order is not None
    items = order.payload.get("items") or []
    if not items:
        raise ValueError(f"order {order.key} has no items")
    total = sum(item["qty"] * item["price"] for item in items)
    await toolbelt.emit(
        loom.EventIn(
            source="pricing",
            delivery_id=f"{request.execution_id}/priced",  # stable: a retried attempt emits it once
            type="order.priced",
            scope=request.scope,
            payload={"order": order.key, "total": total},
        )
    )
    return {"items": len(items), "total": total}


@app.function("receipt")
def receipt(request: loom.RunRequest, toolbelt: loom.Toolbelt) -> str:
    """A plain function runs in a worker thread (it may block); its return value is the result."""
    priced = request.origin or request.trigger
    assert priced is not None
    return f"receipt for {priced.payload.get('order')}: {priced.payload.get('total')}"
