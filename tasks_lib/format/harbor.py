"""Harbor's task model (the `harbor` package, schema_version 1.4), field for field as rollyard reads
it from task.toml, and the rule for what the local backend cannot run faithfully (refusals).

Harbor's own reference is `harbor/models/task/config.py`; the fields here keep its names and
defaults (a plain Harbor task gets *public* network unless it says otherwise). rollyard's own
fields live in `[metadata.rollyard]` (the older top-level `[rollyard]` table is still read).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping
from typing import Any, Literal

from sandboxes.egress import ENTRY_FORM, HostPort
from tasks_lib.format.issues import IssueSink

SCHEMA_VERSION = "1.4"
"""The Harbor task schema rollyard writes."""
NETWORK_MODES = ("no-network", "public", "allowlist")
NetworkMode = Literal["no-network", "public", "allowlist"]
VerifierMode = Literal["shared", "separate"]
REWARD_KEY = "reward"
"""The metric Harbor's 1-D convention names `reward` (what reward.txt holds)."""

TOP_LEVEL_FIELDS = (
    "schema_version", "version", "task", "metadata", "verifier", "agent", "environment",
    "solution", "source", "multi_step_reward_strategy", "steps", "artifacts", "rollyard",
)  # fmt: skip
TASK_FIELDS = ("name", "version", "description", "authors", "keywords")
AGENT_FIELDS = ("timeout_sec", "user", "network_mode", "allowed_hosts")
VERIFIER_FIELDS = (
    "timeout_sec", "env", "user", "environment_mode", "environment", "collect",
    "network_mode", "allowed_hosts",
)  # fmt: skip
ENVIRONMENT_FIELDS = (
    "build_timeout_sec", "docker_image", "os", "cpus", "memory_mb", "storage_mb", "gpus",
    "gpu_types", "tpu", "mcp_servers", "env", "skills_dir", "healthcheck", "workdir",
    "allow_internet", "network_mode", "allowed_hosts", "memory", "storage",
)  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class NetworkPolicy:
    """Harbor's network policy of one phase: `no-network`, `public`, or `allowlist` of hosts."""

    mode: NetworkMode = "public"
    allowed_hosts: tuple[str, ...] = ()

    @property
    def egress_hosts(self) -> tuple[str, ...]:
        """The hosts a sandbox of this phase reaches through the egress proxy (none unless
        `allowlist`): `sandboxes.Limits.allowed_hosts`."""
        return self.allowed_hosts if self.mode == "allowlist" else ()


@dataclasses.dataclass(frozen=True, slots=True)
class EnvironmentSpec:
    """Harbor's `[environment]` (also the schema of `[verifier.environment]`)."""

    build_timeout_s: float = 600.0
    docker_image: str | None = None
    os: str = "linux"
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    gpus: int | None = None
    gpu_types: tuple[str, ...] = ()
    tpu: bool = False
    mcp_servers: int = 0
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    healthcheck: str | None = None
    """The healthcheck command (a readiness probe of a service the task starts)."""
    workdir: str | None = None
    """Overrides the image's WORKDIR as the working directory of commands."""
    network: NetworkPolicy = dataclasses.field(default_factory=NetworkPolicy)


@dataclasses.dataclass(frozen=True, slots=True)
class HarborConfig:
    """What a task.toml says in Harbor's terms."""

    schema_version: str = SCHEMA_VERSION
    name: str | None = None
    """`[task].name` (`org/name`), absent on older tasks."""
    description: str = ""
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    agent_timeout_s: float | None = None
    agent_user: str | None = None
    agent_network: NetworkPolicy | None = None
    """`[agent]`'s phase override of the environment's network policy."""
    verifier_timeout_s: float = 600.0
    verifier_env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    verifier_user: str | None = None
    verifier_mode: VerifierMode = "shared"
    """Where the verifier runs: the agent's final environment (`shared`) or a fresh one of its
    own (`separate`: `[verifier.environment]`, `tests/Dockerfile`, or the task's image)."""
    verifier_environment: EnvironmentSpec | None = None
    verifier_network: NetworkPolicy | None = None
    collect_hooks: int = 0
    environment: EnvironmentSpec = dataclasses.field(default_factory=EnvironmentSpec)
    solution_env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    steps: int = 0
    """Number of `[[steps]]` (a multi-step task)."""
    artifacts: tuple[str, ...] = ()

    @property
    def agent_network_policy(self) -> NetworkPolicy:
        return self.agent_network or self.environment.network

    @property
    def verifier_network_policy(self) -> NetworkPolicy:
        if self.verifier_network is not None:
            return self.verifier_network
        if self.verifier_environment is not None:
            return self.verifier_environment.network
        return self.environment.network


class _Reader:
    """Reads typed Harbor fields of one table, reporting each problem under its dotted name."""

    def __init__(self, sink: IssueSink, table: Mapping[str, Any], where: str) -> None:
        self.sink, self.table, self.where = sink, table, where

    def bad(self, key: str, message: str, fix: str) -> None:
        self.sink.add("task.toml", f"{self.where}.{key}", self.table.get(key), message, fix)

    def unknown(self, known: tuple[str, ...]) -> None:
        for key in self.table:
            if key not in known:
                self.bad(key, "is not a field of Harbor's task model",
                         f"remove it or use one of {', '.join(known)}")  # fmt: skip

    def number(self, key: str, *, integer: bool = False) -> float | None:
        value = self.table.get(key)
        if value is None:
            return None
        kinds = int if integer else int | float
        if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value):
            self.bad(key, "must be " + ("an integer" if integer else "a number"),
                     f"write e.g. {key} = {1 if integer else 1.0}")  # fmt: skip
            return None
        if value < 0:
            self.bad(key, "must not be negative", "write a positive number")
            return None
        return float(value)

    def text(self, key: str) -> str | None:
        value = self.table.get(key)
        if value is None:
            return None
        if isinstance(value, int) and not isinstance(value, bool) and key == "user":
            return str(value)
        if not isinstance(value, str):
            self.bad(key, "must be a string", f'write {key} = "..."')
            return None
        return value

    def strings(self, key: str) -> tuple[str, ...]:
        value = self.table.get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            self.bad(key, "must be a list of strings", f'write {key} = ["..."]')
            return ()
        return tuple(value)

    def env(self, key: str) -> dict[str, str]:
        value = self.table.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            self.bad(key, "must be a table of string values", f'write [{self.where}.{key}] A = "b"')
            return {}
        return dict(value)

    def table_of(self, key: str) -> dict[str, Any] | None:
        value = self.table.get(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            self.bad(key, "must be a table", f"write [{self.where}.{key}]")
            return None
        return value

    def network(self, *, default: NetworkMode | None) -> NetworkPolicy | None:
        mode = self.table.get("network_mode")
        hosts = self.strings("allowed_hosts")
        if mode is None:
            legacy = self.table.get("allow_internet")
            if isinstance(legacy, bool) and "allowed_hosts" not in self.table:
                mode = "public" if legacy else "no-network"
        if mode is None:
            if hosts:
                self.bad("allowed_hosts", "is only valid when network_mode = 'allowlist'",
                         'add network_mode = "allowlist"')  # fmt: skip
            return None if default is None else NetworkPolicy(default)
        if mode not in NETWORK_MODES:  # narrows `mode` to NetworkMode below
            self.bad("network_mode", "is not a Harbor network mode",
                     f"use one of {', '.join(NETWORK_MODES)}")  # fmt: skip
            return None if default is None else NetworkPolicy(default)
        if hosts and mode != "allowlist":
            self.bad("allowed_hosts", "is only valid when network_mode = 'allowlist'",
                     'set network_mode = "allowlist" or remove allowed_hosts')  # fmt: skip
        checked = typing.cast(NetworkMode, mode)
        return NetworkPolicy(checked, self.host_ports(hosts))

    def host_ports(self, hosts: tuple[str, ...]) -> tuple[str, ...]:
        """`allowed_hosts` in the egress proxy's canonical form; each bad entry an issue."""
        entries: list[str] = []
        for text in hosts:
            try:
                entries.append(str(HostPort.parse(text)))
            except ValueError as error:
                self.bad("allowed_hosts", f"entry {error}", ENTRY_FORM)
        return tuple(entries)


def _size_mb(reader: _Reader, key: str) -> int | None:
    """Harbor's deprecated `memory` / `storage` sizes ('2G', '512M')."""
    value = reader.table.get(key)
    if not isinstance(value, str):
        return None
    text = value.strip().upper()
    scale = {"G": 1024.0, "M": 1.0, "K": 1 / 1024}.get(text[-1:])
    try:
        return int(float(text[:-1]) * scale) if scale is not None else None
    except ValueError:
        reader.bad(key, "is not a size like '2G' or '512M'", f"write {key}_mb = 1024")
        return None


def _environment(
    sink: IssueSink, table: Mapping[str, Any], where: str, default_network: NetworkMode
) -> EnvironmentSpec:
    reader = _Reader(sink, table, where)
    reader.unknown(ENVIRONMENT_FIELDS)
    memory = reader.number("memory_mb", integer=True)
    storage = reader.number("storage_mb", integer=True)
    gpus = reader.number("gpus", integer=True)
    healthcheck = reader.table_of("healthcheck")
    servers = table.get("mcp_servers", [])
    network = reader.network(default=default_network)
    assert network is not None
    return EnvironmentSpec(
        build_timeout_s=reader.number("build_timeout_sec") or 600.0,
        docker_image=reader.text("docker_image"),
        os=(reader.text("os") or "linux").lower(),
        cpus=reader.number("cpus"),
        memory_mb=int(memory) if memory is not None else _size_mb(reader, "memory"),
        storage_mb=int(storage) if storage is not None else _size_mb(reader, "storage"),
        gpus=int(gpus) if gpus is not None else None,
        gpu_types=reader.strings("gpu_types"),
        tpu=table.get("tpu") is not None,
        mcp_servers=len(servers) if isinstance(servers, list) else 0,
        env=reader.env("env"),
        healthcheck=str((healthcheck or {}).get("command")) if healthcheck else None,
        workdir=reader.text("workdir"),
        network=network,
    )


def parse_harbor_config(
    sink: IssueSink, doc: Mapping[str, Any], *, default_network: NetworkMode = "public"
) -> HarborConfig:
    """Harbor's view of a parsed task.toml; `default_network` is the network of an environment
    that names none (Harbor's default is `public`; a task written for rollyard means none)."""
    top = _Reader(sink, doc, "task.toml")
    for key in doc:
        if key not in TOP_LEVEL_FIELDS:
            sink.add("task.toml", key, doc[key], "is not a field of Harbor's task model",
                     "move it under [metadata] (rollyard's own fields: [metadata.rollyard])")  # fmt: skip
    schema = doc.get("schema_version", doc.get("version", SCHEMA_VERSION))
    package = top.table_of("task") or {}
    task = _Reader(sink, package, "task")
    task.unknown(TASK_FIELDS)
    name = task.text("name")
    if name is not None and (name.count("/") != 1 or ".." in name or not all(name.split("/"))):
        task.bad("name", "must be 'org/name'", 'write name = "org/task-name"')
    metadata = top.table_of("metadata") or {}
    agent = _Reader(sink, top.table_of("agent") or {}, "agent")
    agent.unknown(AGENT_FIELDS)
    verifier_table = top.table_of("verifier") or {}
    verifier = _Reader(sink, verifier_table, "verifier")
    verifier.unknown(VERIFIER_FIELDS)
    environment = _environment(sink, top.table_of("environment") or {}, "environment",
                               default_network)  # fmt: skip
    verifier_env_table = verifier.table_of("environment")
    verifier_environment = (
        _environment(sink, verifier_env_table, "verifier.environment", default_network)
        if verifier_env_table is not None
        else None
    )
    mode = verifier.text("environment_mode")
    if mode not in (None, "shared", "separate"):
        verifier.bad("environment_mode", "is not a verifier mode", 'use "shared" or "separate"')
        mode = None
    if mode == "shared" and verifier_environment is not None:
        verifier.bad("environment_mode", "is 'shared' but [verifier.environment] is set",
                     'set environment_mode = "separate" or remove [verifier.environment]')  # fmt: skip
    resolved_mode: VerifierMode = (
        "separate" if mode == "separate" or (mode is None and verifier_environment) else "shared"
    )
    collect = verifier_table.get("collect", [])
    solution = _Reader(sink, top.table_of("solution") or {}, "solution")
    steps = doc.get("steps")
    artifacts = doc.get("artifacts", [])
    return HarborConfig(
        schema_version=str(schema),
        name=name,
        description=str(package.get("description", "")),
        metadata=metadata,
        agent_timeout_s=agent.number("timeout_sec"),
        agent_user=agent.text("user"),
        agent_network=agent.network(default=None),
        verifier_timeout_s=verifier.number("timeout_sec") or 600.0,
        verifier_env=verifier.env("env"),
        verifier_user=verifier.text("user"),
        verifier_mode=resolved_mode,
        verifier_environment=verifier_environment,
        verifier_network=verifier.network(default=None),
        collect_hooks=len(collect) if isinstance(collect, list) else 0,
        environment=environment,
        solution_env=solution.env("env"),
        steps=len(steps) if isinstance(steps, list) else 0,
        artifacts=tuple(
            item if isinstance(item, str) else str(item.get("source", ""))
            for item in artifacts
            if isinstance(item, str | dict)
        )
        if isinstance(artifacts, list)
        else (),
    )
