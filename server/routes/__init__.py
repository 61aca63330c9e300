"""The REST API, one module per feature, each with its bodies, their limits, its handlers and
its `ROUTES`: search, rerank (with the TEI and Infinity shapes), embeddings (with the TEI and
Cohere shapes), documents and jobs, health. `server.shared` holds what they share; the app
factory lists the routers."""
