"""`ragrank finetune`: domain adaptation of the reranker and the embedder on a BEIR-format
collection's own relevance labels, with sentence-transformers' training API."""
