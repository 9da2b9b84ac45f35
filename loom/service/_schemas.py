"""JSON Schemas of the API's answers, generated from the records they are made of (docs/http-api.md).

`record_schema` reads an attrs record's fields and their types (the same fields the JSON answer has,
since every answer is the record as the serde converter writes it), so an answer and its documented
schema cannot drift apart: a new field is documented as soon as it exists. Each record is one named
component (``#/components/schemas/Work``); `Answers` collects the components an OpenAPI document
refers to.
"""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ..records.events import Diagnostic, Event
from ..records.executor import AttemptLogs
from ..records.results import WorkResult
from ..records.timers import Firing, Timer
from ..records.waits import Wait
from ..records.work import Checkpoint, Execution, Intent, Work

_SCALARS: dict[object, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
}


def ref(cls: type) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{cls.__name__}"}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


class Answers:
    """The components that the answers' schemas refer to, filled in as records are met."""

    def __init__(self) -> None:
        self.components: dict[str, dict[str, Any]] = {}

    def of(self, hint: object) -> dict[str, Any]:
        """The JSON Schema of a value of the type ``hint`` as the serde converter writes it."""
        origin = typing.get_origin(hint)
        args = typing.get_args(hint)
        if hint in _SCALARS:
            return dict(_SCALARS[hint])
        if hint is Any or hint is object:
            return {}
        if origin in (typing.Union, types.UnionType):
            options = [arg for arg in args if arg is not type(None)]
            inner = self.of(options[0]) if len(options) == 1 else {"anyOf": [self.of(a) for a in options]}
            return nullable(inner) if len(options) < len(args) else inner
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            return {"type": "string", "enum": [member.value for member in hint]}
        if isinstance(hint, type) and attrs.has(hint):
            self.record(hint)
            return ref(hint)
        if origin in (tuple, list, frozenset, set) or (
            isinstance(origin, type) and issubclass(origin, Sequence) and origin is not str
        ):
            item = args[0] if args else Any
            return {"type": "array", "items": self.of(item)}
        if origin in (dict, Mapping) or (isinstance(origin, type) and issubclass(origin, Mapping)):
            value = args[1] if len(args) == 2 else Any
            return {"type": "object", "additionalProperties": self.of(value)}
        if hint in (dict, Mapping):
            return {"type": "object"}
        raise TypeError(f"no JSON Schema for {hint!r}")  # a new field type: teach this function

    def record(self, cls: type) -> dict[str, Any]:
        """The component of an attrs record: every field required (the answer writes each one)."""
        name = cls.__name__
        if name not in self.components:
            self.components[name] = {}  # a placeholder while its fields refer back to it
            hints = typing.get_type_hints(cls)
            fields = attrs.fields(cls)
            schema: dict[str, Any] = {
                "type": "object",
                "properties": {f.name: self.of(hints[f.name]) for f in fields},
                "required": [f.name for f in fields],
                "additionalProperties": False,
            }
            if cls.__doc__ and not cls.__doc__.startswith(f"{name}("):
                schema["description"] = " ".join(cls.__doc__.split())
            self.components[name] = schema
        return ref(cls)


def obj(**properties: dict[str, Any]) -> dict[str, Any]:
    """A closed object with these properties, all required."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def array(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": schema}


def page(name: str, item: dict[str, Any], cursor: dict[str, Any]) -> dict[str, Any]:
    """A page of a list: its items under ``name``, and ``next_after``, the cursor of the next page
    (``null`` when this page is the last)."""
    return obj(**{name: array(item), "next_after": nullable(cursor)})


STRING = {"type": "string"}
INTEGER = {"type": "integer"}

# the answers' shapes, by name; `_app` names one per operation
EVENT = ref(Event)
WORK = ref(Work)
TIMER = ref(Timer)
EXECUTION = ref(Execution)
INTENT = ref(Intent)
WORK_VIEW = obj(
    work=WORK,
    result=ref(WorkResult),
    wait=nullable(ref(Wait)),
    pending_inputs=array(EVENT),
    waits=array(ref(Wait)),
    timers=array(TIMER),
    diagnostics=array(ref(Diagnostic)),
    history=obj(checkpoints=array(ref(Checkpoint)), executions=array(EXECUTION)),
)
EVENT_VIEW = obj(event=EVENT, checkpoint=nullable(ref(Checkpoint)))
TIMER_VIEW = obj(timer=TIMER, firings=array(ref(Firing)))
EVENTS_PAGE = page("events", EVENT, INTEGER)
WORK_PAGE = page("work", WORK, STRING)
TIMERS_PAGE = page("timers", TIMER, STRING)
DIAGNOSTICS_PAGE = page("diagnostics", ref(Diagnostic), INTEGER)
ERROR = {"$ref": "#/components/schemas/Error"}
BATCH = obj(
    results=array(
        {
            "anyOf": [
                obj(status={"enum": [200, 201]}, event=EVENT),
                obj(status={"type": "integer", "minimum": 400, "maximum": 599}, error=ERROR),
            ]
        }
    ),
    accepted=INTEGER,
    duplicates=INTEGER,
    refused=INTEGER,
)
"""A batch's answer: one result per item, in order, and how many were accepted, duplicates, refused."""
EVENT_OR_BATCH = {"anyOf": [EVENT, BATCH]}
HEALTH = obj(
    status={"type": "string", "const": "ok"}, now_ms=INTEGER, now=STRING, test_clock={"type": "boolean"}
)
CLOCK = obj(now_ms=INTEGER, now=STRING, floor_ms=nullable(INTEGER))
HEARTBEAT = obj(execution_id=STRING, expires_at_ms=INTEGER)
RECORDS: tuple[type, ...] = (
    Event,
    Work,
    Timer,
    Execution,
    Intent,
    Wait,
    Checkpoint,
    Firing,
    Diagnostic,
    WorkResult,
    AttemptLogs,
)
"""Every record an answer holds: each is one component of the document."""


def components() -> dict[str, dict[str, Any]]:
    """The components of every record in `RECORDS` (and the records they hold)."""
    answers = Answers()
    for cls in RECORDS:
        answers.record(cls)
    return answers.components
