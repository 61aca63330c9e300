"""The composition root's one recipe for the served resources: the models (one `Inference`,
from each model's spec), the store, opened and made ready, and the job queue, as `ragrank
serve`, `demo` and the benchmarks that start a real server use them."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ragrank.settings import Settings
    from server import Services


def load_services(settings: Settings) -> Services:
    """Load the served models (refused, with the figures, when they do not fit their devices)
    and open the store: the collection is created if missing, and an embedded one builds its
    index before anything is answered."""
    from ragrank.backends.serving import load_inference
    from ragrank.jobs import LazyJobQueue
    from ragrank.sparse import sparse_encoder
    from ragrank.store import open_store
    from ragrank.store.maintenance import indexed_sparse_encoder
    from server import Services

    inference = load_inference(settings)
    sparse = sparse_encoder(settings)
    store = open_store(settings)
    try:
        store.ensure_collection(inference.embedder.dimension)
        # A collection indexed in one fixed language answers in it until re-indexed.
        sparse = indexed_sparse_encoder(store, sparse)
        # An embedded store builds its index here, before the server answers anything: the
        # build stops every thread of the process (see ragrank/store/edge.py).
        store.optimize()
    except Exception:
        store.close()
        raise
    return Services(inference=inference, store=store, sparse=sparse, jobs=LazyJobQueue(settings))
