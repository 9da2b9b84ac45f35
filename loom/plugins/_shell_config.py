"""A ``shell`` binding's config, read by one set of checks both when a configuration is loaded
(`ShellExecutor.validate_config`: a `ConfigError` naming the key, so the configuration is refused) and
when an attempt launches (`read_config`: an `InvalidRequest` the attempt fails with). The two can never
disagree: a config that loads is one every launch accepts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from ..config._keys import key_path
from ..records.errors import ConfigError, InvalidRequest

DEFAULT_GRACE_S = 10.0
DEFAULT_ACK_TIMEOUT_S = 30.0
MAX_SECONDS = 24 * 3600.0
CONFIG_KEYS = ("command", "env", "cwd", "grace_s", "ack_timeout_s", "on_close")


@attrs.frozen(kw_only=True)
class ShellConfig:
    """A binding's config, checked: `parse_config` names the bad key."""

    command: tuple[str, ...]
    env: Mapping[str, str] = attrs.field(factory=dict)
    cwd: str | None = None
    grace_s: float = DEFAULT_GRACE_S
    ack_timeout_s: float = DEFAULT_ACK_TIMEOUT_S
    stop_on_close: bool = False


def _seconds(config: Mapping[str, Any], key: str, default: float) -> float:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_SECONDS:
        raise ConfigError(f"must be seconds from 0 to {MAX_SECONDS:g}", key=key)
    return float(value)


def _no_nul(text: str, key: str) -> None:
    """The operating system takes no NUL in an argument, an environment variable or a path."""
    if "\0" in text:
        raise ConfigError("must not hold a NUL character", key=key)


def parse_config(config: Mapping[str, Any]) -> ShellConfig:
    """The binding's config as a `ShellConfig`, or `ConfigError` whose ``key`` is the key of ``config``
    that is wrong (``command``, ``command[1]``, ``env.NAME``; none for an unknown key, which its message
    names) and whose ``reason`` says what is wrong."""
    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        raise ConfigError(f"unknown config key {unknown[0]!r}; expected some of: {', '.join(CONFIG_KEYS)}")
    command = config.get("command")
    if (
        not isinstance(command, list | tuple)
        or not command
        or not all(isinstance(part, str) and part for part in command)
    ):
        raise ConfigError('must be a non-empty list of strings, e.g. ["make", "test"]', key="command")
    for i, part in enumerate(command):
        _no_nul(part, f"command[{i}]")
    env = config.get("env", {})
    if not isinstance(env, Mapping) or not all(
        isinstance(k, str) and k and "=" not in k and isinstance(v, str) for k, v in env.items()
    ):
        raise ConfigError("must be a table of names to strings", key="env")
    for name, value in env.items():
        _no_nul(name, "env")
        _no_nul(value, key_path("env", name))
    cwd = config.get("cwd")
    if cwd is not None and (not isinstance(cwd, str) or not cwd):
        raise ConfigError("must be a directory path", key="cwd")
    if cwd is not None:
        _no_nul(cwd, "cwd")
    on_close = config.get("on_close", "leave")
    if on_close not in ("leave", "stop"):
        raise ConfigError('must be "leave" or "stop"', key="on_close")
    return ShellConfig(
        command=tuple(command),
        env=dict(env),
        cwd=cwd,
        grace_s=_seconds(config, "grace_s", DEFAULT_GRACE_S),
        ack_timeout_s=_seconds(config, "ack_timeout_s", DEFAULT_ACK_TIMEOUT_S),
        stop_on_close=on_close == "stop",
    )


def read_config(config: Mapping[str, Any]) -> ShellConfig:
    """The binding's config as a `ShellConfig`, or `InvalidRequest` naming the key that is wrong (the
    attempt fails with it): `parse_config`'s checks, said for an attempt."""
    try:
        return parse_config(config)
    except ConfigError as exc:
        where = f"config.{exc.key}" if exc.key else "config"
        said = f"{where} {exc.reason}" if exc.key else exc.reason
        raise InvalidRequest(f"shell executor: {said}", field=where) from None
