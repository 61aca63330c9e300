"""The two roles a served model plays, declared once: every other spelling of a role (its API
name, its settings, its label in messages, its engine's name) derives from these records.
Torch-free and settings-free, so that any module can read them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: A role as the API names it: `/v1/models`' `type`, a models file's `role`.
RoleName = Literal["embedding", "rerank"]


@dataclass(frozen=True)
class Role:
    """One model role."""

    #: Its API name.
    name: RoleName
    #: Its settings' prefix: `embed` for `RAGRANK_EMBED_MODEL`, `RAGRANK_EMBED_BACKEND`, ...
    prefix: str
    #: How messages call its models: "the embedding model", "the reranking model".
    label: str
    #: What a fine-tuning run of this role trains (`ragrank finetune embedder`).
    trainee: str

    def setting(self, key: str) -> str:
        """The settings field of this role's `key`: `model` -> `embed_model`."""
        return f"{self.prefix}_{key}"

    @property
    def engine(self) -> str:
        """The name of its models' batching engines, in metrics and errors."""
        return self.prefix


EMBEDDING = Role(name="embedding", prefix="embed", label="embedding", trainee="embedder")
RERANK = Role(name="rerank", prefix="rerank", label="reranking", trainee="reranker")
ROLES = (EMBEDDING, RERANK)


def role_named(name: str) -> Role:
    """The role whose API name, settings prefix or trainee is `name`; ValueError otherwise."""
    for role in ROLES:
        if name in (role.name, role.prefix, role.trainee, role.label):
            return role
    raise ValueError(f"unknown role {name!r}: one of {', '.join(r.name for r in ROLES)}")
