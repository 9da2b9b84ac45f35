"""The OpenAPI 3.1 document of ``loom serve``, generated from the operation table in `_app` (so it
describes every route, its inputs and each answer it can give)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import __version__
from ..records.work import WorkState
from ..runtime import MAX_BATCH
from ._ops import Op
from ._schemas import components
from ._wire import BAD_REQUEST, JSON_VALUE, LOOKUP, MAX_PAGE, MISDIRECTED, SCOPE, UNAUTHORIZED, Field

_FIELD_SCHEMAS: dict[str, dict[str, Any]] = {
    "string": {"type": "string"},
    "integer": {"type": "integer"},
    "boolean": {"type": "boolean"},
    "object": {"type": "object"},
    "strings": {"type": "array", "items": {"type": "string"}},
    "amounts": {"type": "object", "additionalProperties": {"type": "number"}},
    "json": {},
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
    schema = dict(_FIELD_SCHEMAS[field.kind])
    for name, value in field.schema.items():  # items and additionalProperties add to their JSON type
        base = schema.get(name)
        schema[name] = base | value if isinstance(base, dict) and isinstance(value, dict) else value
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


def _operation(op: Op, *, operator_token: bool) -> dict[str, Any]:
    parameters: list[dict[str, Any]] = [
        {
            "name": name,
            "in": "path",
            "required": True,
            "schema": op.path_schemas.get(name, {"type": "string", **LOOKUP}),
        }
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
        responses[str(status)] = {"description": description, "content": {op.media: {"schema": op.answer}}}
    for kind in op.documented_errors(operator_token=operator_token):
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
        schema = body_schema(op.body) | op.body_schema
        if op.batch:  # one object, or an array of them accepted in order (JSON lines too: see the docs)
            batch = {
                "type": "array",
                "minItems": 1,
                "maxItems": MAX_BATCH,
                "description": "a batch: each item an Event object as above, checked and answered on its"
                " own (a bad item is refused in its result, and the others are accepted)",
            }
            schema = {"anyOf": [schema, batch]}
        operation["requestBody"] = {
            "required": op.body_required,
            "content": {"application/json": {"schema": schema}},
        }
    if op.auth:
        operation["security"] = [{"executionToken": []}]
    elif operator_token and op.needs_operator_token:
        operation["security"] = [{"operatorToken": []}]
    return operation


def document(ops: Sequence[Op], *, test_clock: bool, operator_token: bool = False) -> dict[str, Any]:
    """The document for this server (``/debug/clock`` only under the test clock; ``operator_token``:
    the server requires its operator token)."""
    paths: dict[str, dict[str, Any]] = {}
    for op in ops:
        if op.test_clock_only and not test_clock:
            continue
        paths.setdefault(op.openapi_path, {})[op.method.lower()] = _operation(
            op, operator_token=operator_token
        )
    for path, operation in _web_operations(operator_token=operator_token).items():
        paths[path] = {"get": operation}
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
            "schemas": {"Error": ERROR_SCHEMA, "JsonValue": JSON_VALUE, **components()},
            "securitySchemes": _security_schemes(operator_token=operator_token),
        },
    }


def _json_error(text: str) -> dict[str, Any]:
    return {
        "description": text,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def _web_operations(*, operator_token: bool) -> dict[str, dict[str, Any]]:
    """The web view's pages. Its filter form sends the fields left empty, which mean "any"."""
    html = {"200": {"description": "an HTML page", "content": {"text/html": {"schema": {"type": "string"}}}}}
    errors: dict[str, Any] = {
        str(BAD_REQUEST.status): {
            "description": "bad filter",
            "content": {"text/html": {"schema": {"type": "string"}}},
        },
        str(MISDIRECTED.status): _json_error(f"{MISDIRECTED.name}: {MISDIRECTED.meaning}"),
    }
    if operator_token:
        errors[str(UNAUTHORIZED.status)] = _json_error(f"{UNAUTHORIZED.name}: the operator token is required")
    security: dict[str, Any] = (
        {"security": [{"operatorToken": []}, {"operatorPassword": []}]} if operator_token else {}
    )
    empty = {"type": "string", "maxLength": 0}
    states = [state.value for state in WorkState]
    list_page = {
        "operationId": "get_ui_work",
        "summary": "Web view: Work by last change, filtered by scope, state and key",
        "tags": ["web"],
        "parameters": [
            {"name": name, "in": "query", "required": False, "schema": schema}
            for name, schema in (
                ("scope", {"anyOf": [empty, {"type": "string", **SCOPE}]}),
                ("state", {"type": "string", "enum": ["", *states]}),
                ("key", {"anyOf": [empty, {"type": "string", **LOOKUP}]}),
                ("limit", {"type": "integer", "minimum": 1, "maximum": MAX_PAGE}),
            )
        ],
        "responses": html | errors,
        **security,
    }
    work_page = {
        "operationId": "get_ui_work_page",
        "summary": "Web view: one Work with its history, waits and timers",
        "tags": ["web"],
        "parameters": [
            {"name": "work_id", "in": "path", "required": True, "schema": {"type": "string", **LOOKUP}}
        ],
        "responses": html
        | errors
        | {"404": {"description": "no such Work", "content": {"text/html": {"schema": {"type": "string"}}}}},
        **security,
    }
    return {"/ui/work": list_page, "/ui/work/{work_id}": work_page}


def _security_schemes(*, operator_token: bool) -> dict[str, Any]:
    schemes: dict[str, Any] = {
        "executionToken": {
            "type": "http",
            "scheme": "bearer",
            "description": "the token of the execution's current lease (given to its executor)",
        }
    }
    if operator_token:
        schemes["operatorToken"] = {
            "type": "http",
            "scheme": "bearer",
            "description": "the server's operator token (loom serve --token-file)",
        }
        schemes["operatorPassword"] = {
            "type": "http",
            "scheme": "basic",
            "description": "the operator token as the password (any user name), for a browser",
        }
    return schemes
