"""The settings rollyard reads from the environment, all in one pydantic-settings model.

Every variable the README lists is a field here (or one of the `ROLLYARD_GATE_<FIELD>` and
`ROLLYARD_CURATE_<FIELD>` families, collected as text for `storage.gates.GateSettings` and
`tasks_lib.curate.CurationSettings` to type). Nothing reads `os.environ` for these elsewhere.
Read when `settings()` is called, never at import; a value that does not fit raises
`SettingsError` naming the variable.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, Field, NonNegativeInt, SecretStr, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from rollyard.errors import SettingsError

ENV_PREFIX = "ROLLYARD_"
# Families of variables whose fields belong to a settings class of a package above this one.
_FAMILIES = {"gate": "ROLLYARD_GATE_", "curate": "ROLLYARD_CURATE_"}


class RollyardSettings(BaseSettings):
    """Every setting rollyard reads from the environment (prefix `ROLLYARD_`)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, frozen=True, extra="ignore", populate_by_name=True
    )

    store: str = ".rollyard"
    """`ROLLYARD_STORE`: the trajectory store root every `--store` option and the notebooks
    default to (a directory or an object-storage URI)."""
    sandbox_root: Path = Path("/var/lib/rollyard/sandboxes")
    """`ROLLYARD_SANDBOX_ROOT`: where the bwrap backend keeps sandbox state."""
    snapshot_cache_mb: NonNegativeInt = 4096
    """`ROLLYARD_SNAPSHOT_CACHE_MB`: byte budget of the bwrap backend's workspace copies."""
    docker_base_image: str = "rollyard/base:bookworm-py3"
    """`ROLLYARD_DOCKER_BASE_IMAGE`: the docker backend's base image."""
    docker_python_image: str | None = None
    """`ROLLYARD_DOCKER_PYTHON_IMAGE`: the image a repository environment (SWE-bench import)
    builds on when it wants another Python than the base image's, `{python}` standing for the
    version (e.g. `registry.example.com/python:{python}-bookworm`)."""
    openai_api_key: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("ROLLYARD_OPENAI_API_KEY", "OPENAI_API_KEY"),
    )
    """`ROLLYARD_OPENAI_API_KEY`, else `OPENAI_API_KEY`: the key an `openai:` policy sends."""
    openai_request_deadline_s: float = Field(default=600.0, gt=0, le=7 * 24 * 3600)
    """`ROLLYARD_OPENAI_REQUEST_DEADLINE_S`: the most one model request of an `openai:` policy
    may take, its retries and every read included; past it the episode is an `infra_error`."""
    cache_dir: Path | None = None
    """`ROLLYARD_CACHE_DIR`: where rollyard keeps what it can rebuild (the Prefect database
    template, reproduced Harbor workspaces); default `$XDG_CACHE_HOME/rollyard`, else
    `~/.cache/rollyard` (`cache_root`)."""
    reviewer: str | None = None
    """`ROLLYARD_REVIEWER`: who `rollyard review` records as the reviewer (default: the user)."""
    gate: dict[str, str] = Field(default_factory=dict)
    """`ROLLYARD_GATE_<FIELD>`: quality gate thresholds as text, by field name."""
    curate: dict[str, str] = Field(default_factory=dict)
    """`ROLLYARD_CURATE_<FIELD>`: curation settings as text, by field name."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _FamiliesSource(settings_cls))


class _FamiliesSource(EnvSettingsSource):
    """The `ROLLYARD_GATE_*` and `ROLLYARD_CURATE_*` variables, by family and field name."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        prefix = _FAMILIES.get(field_name)
        if prefix is None:
            return None, field_name, False
        found = {
            name[len(prefix) :].lower(): value
            for name, value in self.env_vars.items()
            if name.upper().startswith(prefix) and len(name) > len(prefix)
        }
        return (found or None), field_name, False

    def prepare_field_value(
        self, field_name: str, field: FieldInfo, value: Any, value_is_complex: bool
    ) -> Any:
        return value


def settings(**overrides: Any) -> RollyardSettings:
    """The settings from the environment as it is now (`overrides` win over it)."""
    try:
        return RollyardSettings(**overrides)
    except ValidationError as error:
        first = error.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else "?"
        variable = ENV_PREFIX + field.upper()
        value = os.environ.get(variable, first.get("input"))
        raise SettingsError(
            f"{variable}={value!r}: {first['msg'].lower()}; fix or unset the variable"
        ) from None


def store_root(default: str | None = None) -> str:
    """The store root: `ROLLYARD_STORE` when it is set, else `default` (a notebook passes the
    checkout's store relative to itself), else the settings' default."""
    current = settings()
    if default is None or "store" in current.model_fields_set:
        return current.store
    return default


def cache_root() -> Path:
    """Where rollyard keeps what it can rebuild: `ROLLYARD_CACHE_DIR`, else
    `$XDG_CACHE_HOME/rollyard`, else `~/.cache/rollyard`."""
    configured = settings().cache_dir
    if configured is not None:
        return configured
    # XDG_CACHE_HOME is the desktop standard's variable, not a rollyard setting.
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rollyard"
