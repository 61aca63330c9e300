"""The exception hierarchy every part of ragrank raises; the server maps it to HTTP statuses."""

from __future__ import annotations


class RagrankError(Exception):
    """Base class: a problem ragrank can explain to its user."""

    code = "internal_error"


class SettingsError(RagrankError):
    """A setting is missing or malformed; the message names the environment variable."""

    code = "invalid_settings"


class ModelLoadError(RagrankError):
    """A model could not be loaded; the message names the model and the setting to change."""

    code = "model_unavailable"


class StoreError(RagrankError):
    """Qdrant is unreachable or refused an operation."""

    code = "store_unavailable"


class StoreUnreachableError(StoreError):
    """Qdrant did not answer, or answered that it is overloaded or failing (5xx, 429): worth
    retrying, unlike a refusal of the operation itself."""


class CollectionMismatchError(StoreError):
    """The collection exists with another vector size or distance than the model needs."""

    code = "collection_mismatch"


class SparseVectorsMissingError(CollectionMismatchError):
    """The collection predates BM25 sparse vectors, which sparse and hybrid retrieval need."""

    code = "sparse_vectors_missing"


class JobQueueError(RagrankError):
    """The job queue refused an operation: a second worker where only one may run, or a
    schema newer than this version knows."""

    code = "job_queue_error"


class JobQueueUnavailableError(JobQueueError):
    """The job queue's database cannot be reached now: worth retrying."""

    code = "job_queue_unavailable"


class DocumentError(RagrankError):
    """An input document is malformed; the message names the source and the line."""

    code = "invalid_document"


class InvalidRequestError(RagrankError):
    """Well-formed JSON that breaks a rule spanning fields (e.g. top_k > candidates)."""

    code = "invalid_request"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class BatchTooLargeError(RagrankError):
    """The device ran out of memory on one batch; a smaller batch may fit."""

    code = "batch_too_large"


class ModelFailedError(RagrankError):
    """The model can no longer run (e.g. a CUDA error other than out-of-memory)."""

    code = "model_failed"


class ClientDisconnectedError(RagrankError):
    """The client went away before its answer was ready; its queued work was dropped."""

    code = "client_disconnected"


class QueueFullError(RagrankError):
    """The engine's queue cannot take this request now; retry after `retry_after` seconds."""

    code = "queue_full"

    def __init__(self, message: str, *, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class EngineUnavailableError(RagrankError):
    """The engine is stopped, stopping, or its worker died."""

    code = "engine_unavailable"


class RequestTimeoutError(RagrankError):
    """The request's items were not all processed within the timeout."""

    code = "timeout"


class ItemTooLargeError(RagrankError):
    """One item does not fit on the device even alone."""

    code = "too_large_for_device"


class ModelError(RagrankError):
    """The model raised on a batch holding this request's items."""

    code = "model_error"
