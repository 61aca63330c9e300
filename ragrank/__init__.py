"""ragrank's shared core: settings, the embedder, the cross-encoder scorer and the Qdrant store."""

from pathlib import Path

__version__ = "0.1.0"

#: The multilingual sample collection (BEIR layout) that the demo and the tests use.
SAMPLE_DATASET = Path(__file__).parent / "sample"
