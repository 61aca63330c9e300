"""The model backends: what runs a model on a device. The real embedder and cross-encoder
(`models`), the padding-free forward (`packing`), the OpenVINO CPU backends (`openvino`) and
the gate that checks them against torch (`agreement`), and the reranker families' prompts and
windows (`families`). The batching engine (`ragrank.engine`)
drives them through the light `ragrank.protocols`, never by name."""
