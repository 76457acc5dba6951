"""Worker processes for the local autoscaler: a group member's command, the environment that
carries the parent's settings to it, and the launcher that starts it (`consumers.ops.autoscaler`
decides how many)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, SecretStr

from consumers.analytics.process import child_environment
from docstream.settings import Settings

__all__ = [
    "Child",
    "Launcher",
    "ProcessLauncher",
    "ScaledGroup",
    "settings_environment",
    "worker_command",
]


class Child(Protocol):
    """What the autoscaler needs of a child process (`subprocess.Popen` has all of it)."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...

    def wait(self, timeout: float | None = None) -> int: ...


@dataclass(frozen=True)
class ScaledGroup:
    """A group the autoscaler runs: its short name (logs), Kafka group id, and the command of
    one member (argv)."""

    name: str
    group_id: str
    command: tuple[str, ...]


Launcher = Callable[[ScaledGroup], Child]
"""Starts one member of a group and returns its process."""


def worker_command(name: str) -> tuple[str, ...]:
    """`docstream worker NAME` with this interpreter (no dependency on the console script)."""
    return (sys.executable, "-c", "from docstream.cli import main; main()", "worker", name)


def settings_environment(settings: Settings, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a child needs to read `settings` back with `Settings()`.

    `child_environment(settings)` (the parent's environment and the settings the analytics worker
    needs) with every setting written over it, one variable per leaf (`DOCSTREAM_RUNTIME__RETRY__
    MAX_ATTEMPTS`, JSON for sequences), and the variables of unset (None) settings, and any
    whole-section variable (`DOCSTREAM_RUNTIME='{...}'`), removed: the child gets the parent's
    settings even when they did not come from the parent's environment.
    """
    env = dict(child_environment(settings) if base is None else base)
    config = Settings.model_config
    prefix = str(config.get("env_prefix") or "").upper()
    delimiter = str(config.get("env_nested_delimiter") or "__")
    names: dict[str, str | None] = {}
    for name, info in Settings.model_fields.items():
        value = getattr(settings, name)
        alias = info.validation_alias
        choices = getattr(alias, "choices", None)
        if choices:  # AliasChoices: the first one is written, the others removed
            variables = [str(c).upper() for c in choices]
            names.update(dict.fromkeys(variables[1:]))
            names[variables[0]] = _env_value(value)
        elif isinstance(value, BaseModel):
            section = prefix + name.upper()
            names[section] = None
            for leaf, leaf_value in _leaves(value, section + delimiter, delimiter):
                names[leaf] = _env_value(leaf_value)
        else:
            names[prefix + name.upper()] = _env_value(value)
    sections = tuple(n + delimiter for n, v in names.items() if v is None)
    for variable in list(env):
        upper = variable.upper()
        if upper in names or upper.startswith(sections):
            del env[variable]
    env.update({n: v for n, v in names.items() if v is not None})
    return env


def _leaves(model: BaseModel, prefix: str, delimiter: str) -> Iterator[tuple[str, Any]]:
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            yield from _leaves(value, prefix + name.upper() + delimiter, delimiter)
        else:
            yield prefix + name.upper(), value


def _env_value(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple | dict | set | frozenset):
        return json.dumps(list(value) if isinstance(value, set | frozenset) else value)
    return str(value)


class ProcessLauncher:
    """Starts members as child processes with `env`; their output is appended to
    `<log_dir>/<group name>.log` (inherited from this process when `log_dir` is None)."""

    def __init__(self, env: Mapping[str, str] | None = None, log_dir: Path | None = None) -> None:
        self.env = dict(env) if env is not None else None
        self.log_dir = log_dir
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)

    def log_path(self, group: ScaledGroup) -> Path | None:
        return self.log_dir / f"{group.name}.log" if self.log_dir is not None else None

    def __call__(self, group: ScaledGroup) -> subprocess.Popen[bytes]:
        path = self.log_path(group)
        if path is None:
            return subprocess.Popen(list(group.command), stdin=subprocess.DEVNULL, env=self.env)
        with path.open("ab") as out:
            return subprocess.Popen(
                list(group.command),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
            )
