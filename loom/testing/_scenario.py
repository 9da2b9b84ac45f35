"""Scenario helpers: failures that say which rule broke."""

from __future__ import annotations


class ScenarioFailure(AssertionError):
    """A shared scenario found the runtime breaking a rule; the message names it."""


def expect(condition: object, message: str) -> None:
    """Fail the scenario with ``message`` unless ``condition`` holds (never stripped by -O)."""
    if not condition:
        raise ScenarioFailure(message)
