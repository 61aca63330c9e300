"""The two model roles' implementations: an embedder (bi-encoder) and a scorer
(cross-encoder), each loading through sentence-transformers by hub id or local folder.

Each role is a small Protocol (`ragrank.protocols`) so the server, the indexer and the tests can
swap in fakes. A model is what the batching engine drives: `collate`, `upload`, `launch`,
`fetch`, plus its warm-up and its stamp (`backend`). Its forward pass runs on the torch runner
(`ragrank.backends.torch_runner`) or, compiled once by the one convert-cache-gate step, on
OpenVINO (`ragrank.backends.openvino`); the calibrated device model of `make bench-served`
(`eval.bench.device_model`) is a third implementation of the same interface.

Work is split by thread, so the server can overlap it: tokenising, planning and collating
(`encode_texts`, `plan_windows`, `collate`) run on host threads, each with its own tokenizer
copy; `forward` runs on the model's thread and never tokenises.
"""

from ragrank.backends.embedder import SentenceTransformerEmbedder
from ragrank.backends.reranker import CrossEncoderScorer
from ragrank.backends.torch_runner import device_errors

__all__ = ["CrossEncoderScorer", "SentenceTransformerEmbedder", "device_errors"]
