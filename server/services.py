"""What the server is handed: the models (one `Inference`), the store, the BM25 encoder and the
job queue. The composition root (`cli/`) builds them; the app starts and stops the inference in
its lifespan, and the caller closes the store and the queue."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ragrank.inference import Inference
    from ragrank.jobs import LazyJobQueue
    from ragrank.protocols import Embedder
    from ragrank.sparse import SparseEncoder
    from ragrank.store import Store


@dataclass(frozen=True)
class Services:
    """What the server needs from the core, built once and handed to `create_app`."""

    inference: Inference
    store: Store
    #: Makes BM25 vectors; None when the collection holds dense vectors only.
    sparse: SparseEncoder | None = None
    #: The job queue, opened on first use; None: the app opens the settings' own and closes it.
    jobs: LazyJobQueue | None = None

    @property
    def embedder(self) -> Embedder:
        """The default embedder: the collection's."""
        return self.inference.embedder
