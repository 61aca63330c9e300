"""API keys: when any are configured, every route but the probes needs one; read-only keys may
search, rerank and embed but not change documents."""

from __future__ import annotations

import enum
import hashlib
import hmac
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from litestar.exceptions import NotAuthorizedException, PermissionDeniedException
from litestar.openapi.spec import Reference, SecurityScheme

from ragrank.errors import SettingsError
from ragrank.settings import Settings, env_name

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

    from litestar.connection import ASGIConnection
    from litestar.handlers.base import BaseRouteHandler

#: Handler `opt` keys: `public` routes need no key; `writes` routes need a full key.
PUBLIC = "public"
WRITES = "writes"

#: How the OpenAPI schema describes the two ways to send a key.
SECURITY_SCHEMES: dict[str, SecurityScheme | Reference] = {
    "bearer": SecurityScheme(type="http", scheme="bearer"),
    "apiKey": SecurityScheme(type="apiKey", name="api-key", security_scheme_in="header"),
}


class Access(enum.Enum):
    NONE = 0
    READ = 1
    WRITE = 2


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


@dataclass(frozen=True)
class ApiKeys:
    """Digests of the configured keys; comparisons take the same time whichever key matches."""

    full: tuple[bytes, ...] = ()
    readonly: tuple[bytes, ...] = ()

    @classmethod
    def from_settings(cls, settings: Settings) -> ApiKeys:
        full = _keys(settings.api_keys, settings.api_keys_file, "api_keys_file")
        readonly = _keys(
            settings.readonly_api_keys, settings.readonly_api_keys_file, "readonly_api_keys_file"
        )
        return cls(tuple(map(_digest, full)), tuple(map(_digest, readonly - full)))

    @property
    def enabled(self) -> bool:
        return bool(self.full or self.readonly)

    def access(self, presented: str | None) -> Access:
        if presented is None:
            return Access.NONE
        digest = _digest(presented)
        # No early exit: every stored digest is compared, so timing says nothing of which matched.
        full = _any_equal(digest, self.full)
        readonly = _any_equal(digest, self.readonly)
        return Access.WRITE if full else Access.READ if readonly else Access.NONE


def _any_equal(digest: bytes, stored: Iterable[bytes]) -> bool:
    found = False
    for candidate in stored:
        found |= hmac.compare_digest(digest, candidate)
    return found


def _keys(listed: str, file: Path | None, file_setting: str) -> frozenset[str]:
    """Comma-separated keys plus a file's lines (blank lines and `#` comments skipped)."""
    keys = {key.strip() for key in listed.split(",") if key.strip()}
    if file is not None:
        try:
            lines = file.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise SettingsError(
                f"{env_name(file_setting)}: cannot read {file}: {exc.strerror}"
            ) from None
        keys |= {line.strip() for line in lines if line.strip() and not line.startswith("#")}
    return frozenset(keys)


def presented_key(connection: ASGIConnection[Any, Any, Any, Any]) -> str | None:
    """The key from `Authorization: Bearer <key>` or the `api-key` header."""
    authorization = connection.headers.get("authorization", "")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return connection.headers.get("api-key") or None


def api_key_guard(keys: ApiKeys) -> Any:
    """A Litestar guard enforcing `keys` (a no-op when none are configured)."""

    def guard(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
        if not keys.enabled or handler.opt.get(PUBLIC):
            return
        access = keys.access(presented_key(connection))
        if access is Access.NONE:
            raise NotAuthorizedException(
                "a valid API key is required: send `Authorization: Bearer <key>` "
                "or `api-key: <key>`",
                headers={"WWW-Authenticate": 'Bearer realm="ragrank"'},
            )
        if handler.opt.get(WRITES) and access is not Access.WRITE:
            raise PermissionDeniedException(
                "this API key is read-only: it may search, rerank and embed, not change documents"
            )

    return guard
