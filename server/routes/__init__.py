"""The REST API, one module per domain, each with its bodies, their limits, its handlers and
its `router` (`shared.domain`: path, tags and shared answers declared once): search, rerank
(with the TEI and Infinity shapes), embeddings (with the TEI and Cohere shapes), documents and
jobs, the served models, health, and `root` (what `/` answers). `shared` holds what they
share; the app factory lists the routers, one line each."""
