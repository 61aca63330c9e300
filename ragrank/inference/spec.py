"""One typed spec per served model, built once from settings: from the one-model variables,
from `RAGRANK_EMBED_MODELS`/`RAGRANK_RERANK_MODELS`, or from a models file
(`RAGRANK_MODELS_FILE`, TOML, one `[[models]]` table a model). Whatever a file's table does
not give falls back to the environment's value for that role. Torch-free: building specs
loads nothing."""

from __future__ import annotations

import tomllib
import typing
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ragrank.errors import SettingsError
from ragrank.roles import EMBEDDING, RERANK, ROLES, Role, role_named
from ragrank.settings import (
    ANY_NAME,
    DEFAULT_EMBED_MODEL,
    DEFAULT_RERANK_MODEL,
    DTYPES,
    PRESETS,
    REMOVED_BACKENDS,
    Backend,
    Dtype,
    Packed,
    ServedModel,
    Settings,
    env_name,
    first_name,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

BACKENDS: tuple[str, ...] = typing.get_args(Backend)
PACKED: tuple[str, ...] = typing.get_args(Packed)


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Everything that says how one served model runs."""

    #: The names a request's `model` picks it by; its first (not `*`) names it in metrics.
    names: tuple[str, ...]
    role: Role
    #: A hub id or a local folder.
    model: str
    backend: Backend = "auto"
    dtype: Dtype = "auto"
    #: `auto`, `cpu`, `cuda`, `cuda:N`.
    device: str = "auto"
    #: Items and tokens of one forward pass; 0 is the device's default.
    max_batch_size: int = 0
    max_batch_tokens: int = 0
    packed: Packed = "auto"
    query_prefix: str = ""
    passage_prefix: str = ""
    #: Tokens of one input (a reranker's window); 0 is the model's own limit.
    max_length: int = 0
    #: Least agreement of a compiled backend with torch float32 at load.
    min_agreement: float = 0.9
    #: A Qwen3 reranker's task line; empty for the model card's.
    instruction: str = ""

    @property
    def name(self) -> str:
        return first_name(self.names)


@dataclass(frozen=True)
class ModelSpecs:
    """The served models of both roles, each role's default first."""

    embedders: tuple[ModelSpec, ...]
    rerankers: tuple[ModelSpec, ...]

    def of(self, role: Role) -> tuple[ModelSpec, ...]:
        return self.embedders if role is EMBEDDING else self.rerankers

    @property
    def all(self) -> tuple[ModelSpec, ...]:
        return (*self.embedders, *self.rerankers)


def role_spec(settings: Settings, role: Role, model: str, names: Sequence[str] = ()) -> ModelSpec:
    """A model of `role` configured by the environment's settings for that role."""
    query, passage = settings.prefixes(model) if role is EMBEDDING else ("", "")
    return ModelSpec(
        names=tuple(names) or (model,),
        role=role,
        model=model,
        backend=getattr(settings, role.setting("backend")),
        dtype=settings.dtype,
        device=settings.device,
        max_batch_size=getattr(settings, role.setting("batch_size")),
        max_batch_tokens=getattr(settings, role.setting("batch_tokens")),
        packed=settings.packed,
        query_prefix=query,
        passage_prefix=passage,
        max_length=settings.rerank_max_length if role is RERANK else 0,
        min_agreement=getattr(settings, role.setting("min_agreement")),
        instruction=settings.rerank_instruction if role is RERANK else "",
    )


def model_specs(settings: Settings) -> ModelSpecs:
    """The served models: the models file's, where it names a role's models, else the
    environment's (`RAGRANK_*_MODELS`, else `RAGRANK_*_MODEL`)."""
    from_env = {role.name: _env_specs(settings, role) for role in ROLES}
    if settings.models_file is None:
        return ModelSpecs(from_env["embedding"], from_env["rerank"])
    from_file = read_models_file(settings.models_file, settings)
    chosen = {}
    for role in ROLES:
        listed = tuple(s for s in from_file if s.role is role)
        if listed:
            _refuse_contradiction(settings, role, listed)
        chosen[role.name] = listed or from_env[role.name]
    return ModelSpecs(chosen["embedding"], chosen["rerank"])


def _env_specs(settings: Settings, role: Role) -> tuple[ModelSpec, ...]:
    served = settings.served_embedders if role is EMBEDDING else settings.served_rerankers
    return tuple(role_spec(settings, role, s.model_id, s.names) for s in served)


#: A models file's keys: the required ones, then the optional ones.
REQUIRED_KEYS = ("name", "role", "model")
OPTIONAL_KEYS = (
    "backend",
    "dtype",
    "device",
    "max_batch_tokens",
    "max_batch_size",
    "packed",
    "query_prefix",
    "passage_prefix",
    "max_length",
)


def read_models_file(path: Path, settings: Settings) -> tuple[ModelSpec, ...]:
    """Every `[[models]]` table of the TOML file at `path` as a spec; a `SettingsError` naming
    the file, the model and the choices for a key or value that is not one."""
    variable = env_name("models_file")
    try:
        document = tomllib.loads(path.expanduser().read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SettingsError(f"{variable}: no file at {path}") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"{variable}: {path} is not a readable TOML file: {exc}") from None
    extra = sorted(set(document) - {"models"})
    if extra:
        raise SettingsError(
            f"{variable}: {path} has {', '.join(map(repr, extra))} at the top; it holds "
            f"`[[models]]` tables only"
        )
    tables = document.get("models")
    if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables):
        raise SettingsError(f"{variable}: {path} has no `[[models]]` table")
    specs = tuple(_table_spec(table, n, path, settings) for n, table in enumerate(tables, 1))
    for role in ROLES:
        seen: set[str] = set()
        for spec in (s for s in specs if s.role is role):
            for name in spec.names:
                if name in seen:
                    raise SettingsError(
                        f"{variable}: {path}: the name {name!r} is given to two {role.name} models"
                    )
                seen.add(name)
    return specs


def _table_spec(table: Mapping[str, Any], number: int, path: Path, settings: Settings) -> ModelSpec:
    where = f"{env_name('models_file')}: {path}, model #{number}"
    if isinstance(table.get("model"), str):
        where += f" ({table['model']!r})"

    def fail(problem: str) -> SettingsError:
        return SettingsError(f"{where}: {problem}")

    unknown = sorted(set(table) - {*REQUIRED_KEYS, *OPTIONAL_KEYS})
    if unknown:
        raise fail(
            f"unknown key {', '.join(map(repr, unknown))}; the keys are "
            f"{', '.join(REQUIRED_KEYS)} and optionally {', '.join(OPTIONAL_KEYS)}"
        )
    missing = [key for key in REQUIRED_KEYS if key not in table]
    if missing:
        raise fail(f"missing {', '.join(missing)} (every model needs {', '.join(REQUIRED_KEYS)})")
    model = table["model"]
    if not isinstance(model, str) or not model.strip():
        raise fail("`model` must be a hub id or a folder")
    role_value = table["role"]
    if role_value not in [r.name for r in ROLES]:
        raise fail(f"`role` is {role_value!r}; one of {', '.join(r.name for r in ROLES)}")
    role = role_named(role_value)
    names = _names(table["name"], fail)
    base = role_spec(settings, role, model, (*names, model) if model not in names else names)
    if role is RERANK and ({"query_prefix", "passage_prefix"} & set(table)):
        raise fail("prefixes are for embedding models; a reranker reads the query and passage")
    if role is EMBEDDING and "max_length" in table:
        raise fail("`max_length` is a reranker's window; an embedder reads its model's limit")
    changes = _checked_values(table, fail)
    device = changes.get("device", base.device)
    if not (device in ("auto", "cpu", "cuda") or device.startswith("cuda:")):
        raise fail(f"`device` is {device!r}; one of auto, cpu, cuda, cuda:N")
    return replace(base, **changes)


def _checked_values(table: Mapping[str, Any], fail: Any) -> dict[str, Any]:
    """The optional keys a table gives, each checked against its choices or type."""
    changes: dict[str, Any] = {}
    for key, choices in (("backend", BACKENDS), ("dtype", DTYPES), ("packed", PACKED)):
        if key in table:
            value = table[key]
            if value in REMOVED_BACKENDS and key == "backend":
                raise fail(f"backend {value!r} was removed; use {REMOVED_BACKENDS[value]!r}")
            if value not in choices:
                raise fail(f"`{key}` is {value!r}; one of {', '.join(choices)}")
            changes[key] = value
    for key in ("max_batch_tokens", "max_batch_size", "max_length"):
        if key in table:
            value = table[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise fail(f"`{key}` must be a whole number >= 0 (0: the default), not {value!r}")
            changes[key] = value
    for key in ("device", "query_prefix", "passage_prefix"):
        if key in table:
            if not isinstance(table[key], str):
                raise fail(f"`{key}` must be a string, not {table[key]!r}")
            changes[key] = table[key]
    return changes


def _names(value: object, fail: Any) -> tuple[str, ...]:
    names = (value,) if isinstance(value, str) else value
    if (
        not isinstance(names, list | tuple)
        or not names
        or not all(isinstance(n, str) and n.strip() for n in names)
    ):
        raise fail("`name` must be a name or a list of names")
    if len(set(names)) != len(names):
        raise fail("`name` lists a name twice")
    return tuple(n.strip() for n in names)


def _refuse_contradiction(settings: Settings, role: Role, listed: Sequence[ModelSpec]) -> None:
    """A role whose models both the file and the environment name differently is refused:
    which one was meant cannot be told."""
    many = getattr(settings, role.setting("models"))
    single = getattr(settings, role.setting("model"))
    if many:
        env = tuple(ServedModel(s.names, s.model_id) for s in _parse(settings, role))
        mine = tuple(ServedModel(s.names, s.model) for s in listed)
        if env != mine:
            raise SettingsError(
                f"{env_name('models_file')} names the {role.name} models "
                f"({', '.join(s.name for s in listed)}) and so does "
                f"{env_name(role.setting('models'))}={many!r}, differently: "
                f"unset one of them"
            )
    elif single not in _unset_defaults(settings, role) and single != listed[0].model:
        raise SettingsError(
            f"{env_name('models_file')} makes {listed[0].model!r} the default {role.name} model, "
            f"but {env_name(role.setting('model'))}={single!r}: unset one of them"
        )


def _parse(settings: Settings, role: Role) -> tuple[ServedModel, ...]:
    return settings.served_embedders if role is EMBEDDING else settings.served_rerankers


def _unset_defaults(settings: Settings, role: Role) -> set[str]:
    """The values a role's model setting has when nobody set it: its declared default and the
    presets'."""
    position = 0 if role is EMBEDDING else 1
    declared = (DEFAULT_EMBED_MODEL, DEFAULT_RERANK_MODEL)[position]
    return {declared, *(pair[position] for pair in PRESETS.values())}


__all__ = ["ANY_NAME", "ModelSpec", "ModelSpecs", "model_specs", "read_models_file", "role_spec"]
