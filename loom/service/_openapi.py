"""The OpenAPI 3.1 document of ``loom serve``, generated from the operation table in `_app` (so it
describes every route, its inputs and each answer it can give)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import __version__
from ._ops import Op
from ._wire import BAD_REQUEST, LOOKUP, SCOPE, Field

_FIELD_SCHEMAS: dict[str, dict[str, Any]] = {
    "string": {"type": "string"},
    "integer": {"type": "integer"},
    "boolean": {"type": "boolean"},
    "object": {"type": "object"},
    "strings": {"type": "array", "items": {"type": "string"}},
    "amounts": {"type": "object", "additionalProperties": {"type": "number"}},
}

ERROR_SCHEMA = {
    "type": "object",
    "required": ["error", "field", "message"],
    "properties": {
        "error": {"type": "string", "description": "the kind: invalid_request, not_found, conflict, ..."},
        "field": {"type": ["string", "null"], "description": "the bad field, as the client wrote it"},
        "message": {"type": "string"},
    },
}


def _field_schema(field: Field) -> dict[str, Any]:
    schema = dict(_FIELD_SCHEMAS[field.kind]) | dict(field.schema)
    if field.nullable:
        schema["type"] = [schema["type"], "null"]
    if field.doc:
        schema["description"] = field.doc
    return schema


def body_schema(fields: Sequence[Field]) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {f.name: _field_schema(f) for f in fields},
        "additionalProperties": False,
    }
    required = [f.name for f in fields if f.required]
    if required:
        schema["required"] = required
    return schema


def _operation(op: Op) -> dict[str, Any]:
    parameters: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string", **LOOKUP}}
        for name in op.path_params
    ]
    for q in op.query:
        schema: dict[str, Any] = {"type": q.kind, **q.schema}
        if q.choices:
            schema["enum"] = list(q.choices)
        parameters.append(
            {"name": q.name, "in": "query", "required": False, "description": q.doc, "schema": schema}
        )
    responses: dict[str, Any] = {}
    for status in op.ok:
        description = (
            "accepted again: the original, with duplicate: true" if status == 200 and 201 in op.ok else "ok"
        )
        responses[str(status)] = {"description": description, "content": {op.media: {"schema": {}}}}
    for kind in op.documented_errors:
        existing = responses.get(str(kind.status))
        text = f"{kind.name}: {kind.meaning}"
        if existing is not None:
            existing["description"] += f"; or {text}"
            continue
        responses[str(kind.status)] = {
            "description": text,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
    operation: dict[str, Any] = {
        "operationId": f"{op.method.lower()}_{op.openapi_path.strip('/').replace('/', '_').replace('{', '').replace('}', '').replace('.', '_').replace('-', '_')}",
        "summary": op.summary,
        "tags": [op.tag],
        "parameters": parameters,
        "responses": responses,
    }
    if op.body is not None:
        operation["requestBody"] = {
            "required": op.body_required,
            "content": {"application/json": {"schema": body_schema(op.body) | op.body_schema}},
        }
    if op.auth:
        operation["security"] = [{"executionToken": []}]
    return operation


def document(ops: Sequence[Op], *, test_clock: bool) -> dict[str, Any]:
    """The document for this server (``/debug/clock`` only under the test clock)."""
    paths: dict[str, dict[str, Any]] = {}
    for op in ops:
        if op.test_clock_only and not test_clock:
            continue
        paths.setdefault(op.openapi_path, {})[op.method.lower()] = _operation(op)
    html = {"200": {"description": "an HTML page", "content": {"text/html": {"schema": {"type": "string"}}}}}
    html_errors = {
        str(BAD_REQUEST.status): {
            "description": "bad filter",
            "content": {"text/html": {"schema": {"type": "string"}}},
        }
    }
    paths["/ui/work"] = {
        "get": {
            "operationId": "get_ui_work",
            "summary": "Web view: Work, filtered by scope and state",
            "tags": ["web"],
            "parameters": [
                {"name": name, "in": "query", "required": False, "schema": schema}
                for name, schema in (
                    ("scope", {"type": "string", **SCOPE}),
                    ("state", {"type": "string"}),
                    ("after", {"type": "string"}),
                    ("limit", {"type": "integer", "minimum": 1, "maximum": 1000}),
                )
            ],
            "responses": html | html_errors,
        }
    }
    paths["/ui/work/{work_id}"] = {
        "get": {
            "operationId": "get_ui_work_page",
            "summary": "Web view: one Work with its history, waits and timers",
            "tags": ["web"],
            "parameters": [
                {"name": "work_id", "in": "path", "required": True, "schema": {"type": "string", **LOOKUP}}
            ],
            "responses": html
            | html_errors
            | {
                "404": {
                    "description": "no such Work",
                    "content": {"text/html": {"schema": {"type": "string"}}},
                }
            },
        }
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "loom",
            "version": __version__,
            "description": "The HTTP API of loom serve: Events accepted exactly once, Work, operator controls,"
            " timers, diagnostics, and the execution toolbelt (bearer token of the execution's current lease)."
            " Every refusal is {error, field, message} and changes nothing.",
        },
        "paths": paths,
        "components": {
            "schemas": {"Error": ERROR_SCHEMA},
            "securitySchemes": {
                "executionToken": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "the token of the execution's current lease (given to its executor)",
                }
            },
        },
    }
