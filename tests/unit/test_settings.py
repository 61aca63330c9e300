from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ragrank.errors import SettingsError
from ragrank.reference import render
from ragrank.settings import DEFAULT_EMBED_MODEL, DEFAULT_RERANK_MODEL, Settings, settings_table

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_are_the_documented_models_with_e5_prefixes():
    settings = Settings.from_env({})
    assert settings.embed_model == DEFAULT_EMBED_MODEL == "intfloat/multilingual-e5-base"
    assert settings.rerank_model == DEFAULT_RERANK_MODEL == "BAAI/bge-reranker-v2-m3"
    assert settings.prefixes() == ("query: ", "passage: ")
    assert settings.uses_embedded_qdrant
    assert settings.device == "auto"


def test_a_model_without_e5_in_its_name_gets_no_prefixes():
    settings = Settings.from_env({"RAGRANK_EMBED_MODEL": "sentence-transformers/all-MiniLM-L6-v2"})
    assert settings.prefixes() == ("", "")


def test_explicit_prefixes_win_even_when_empty():
    settings = Settings.from_env({"RAGRANK_QUERY_PREFIX": "Q: ", "RAGRANK_PASSAGE_PREFIX": ""})
    assert settings.prefixes() == ("Q: ", "")
    # They are the default embedder's: another served one keeps its own.
    assert settings.prefixes("intfloat/multilingual-e5-small") == ("query: ", "passage: ")


def test_building_or_replacing_settings_reads_no_model_files(monkeypatch, tmp_path):
    import ragrank.settings

    def no_reads(model: str) -> tuple[str, str]:
        raise AssertionError(f"read {model}'s files")

    monkeypatch.setattr(ragrank.settings, "default_prefixes", no_reads)
    settings = Settings(embed_model=str(tmp_path))
    settings.replace(collection="other").replace(embed_model=str(tmp_path / "x"))


def test_environment_is_read_and_flags_override_it():
    env = {
        "RAGRANK_QDRANT_URL": "http://qdrant:6333",
        "RAGRANK_QDRANT_API_KEY": "secret",
        "RAGRANK_COLLECTION": "docs",
        "RAGRANK_PORT": "9000",
        "RAGRANK_QDRANT_PATH": "/data/q",
    }
    settings = Settings.from_env(env, port=9100, collection=None)
    assert settings.qdrant_url == "http://qdrant:6333"
    assert not settings.uses_embedded_qdrant
    assert settings.collection == "docs"  # a None flag leaves the environment's value
    assert settings.port == 9100
    assert settings.qdrant_path == Path("/data/q")
    assert "secret" not in repr(settings)


def test_preset_fills_models_but_an_explicit_model_wins():
    small = Settings.from_env({"RAGRANK_PRESET": "small"})
    assert small.embed_model == "intfloat/multilingual-e5-small"
    assert small.prefixes()[0] == "query: "
    mixed = Settings.from_env({"RAGRANK_PRESET": "small", "RAGRANK_RERANK_MODEL": "/models/r"})
    assert mixed.rerank_model == "/models/r"
    assert mixed.embed_model == "intfloat/multilingual-e5-small"


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"RAGRANK_PORT": "eighty"}, "RAGRANK_PORT"),
        ({"RAGRANK_PORT": "0"}, "RAGRANK_PORT"),
        ({"RAGRANK_EMBED_BATCH_SIZE": "-1"}, "RAGRANK_EMBED_BATCH_SIZE"),
        ({"RAGRANK_QUEUE_SIZE": "0"}, "RAGRANK_QUEUE_SIZE"),
        ({"RAGRANK_CHUNK_OVERLAP": "300"}, "RAGRANK_CHUNK_OVERLAP"),
        ({"RAGRANK_DTYPE": "int8"}, "RAGRANK_DTYPE"),
        ({"RAGRANK_PRESET": "huge"}, "RAGRANK_PRESET"),
    ],
)
def test_bad_values_name_the_variable(env, named):
    with pytest.raises(SettingsError, match=named):
        Settings.from_env(env)


def test_settings_are_frozen():
    settings = Settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.port = 1  # type: ignore[misc]


def test_every_field_has_a_documented_variable():
    reference = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    missing = [name for name, _ in settings_table() if f"`{name}`" not in reference]
    assert not missing, f"docs/configuration.md lacks {missing}"
    undocumented = [f.name for f in dataclasses.fields(Settings) if not f.metadata.get("help")]
    assert not undocumented, undocumented


def test_the_configuration_reference_is_generated_from_the_settings():
    """`make docs` writes it; a setting added, removed or changed without it fails here."""
    reference = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert reference == render(), "docs/configuration.md is stale: run `make docs`"
    assert "| `RAGRANK_FUSION` | `dbsf` |" in reference
    assert "| `RAGRANK_RERANK_BATCH_SIZE` | `0` = 16 on CPU, 256 on CUDA |" in reference


def test_host_threads_default_to_cores_but_one(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda _: set(range(8)))
    assert Settings().host_threads == 7
    monkeypatch.setattr("os.sched_getaffinity", lambda _: {0})
    assert Settings().host_threads == 1
    assert Settings.from_env({"RAGRANK_TOKENIZER_THREADS": "3"}).host_threads == 3


def _fields_with(key: str) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(Settings) if f.metadata.get(key) is not None]


def test_every_setting_is_documented():
    assert all(f.metadata.get("help") for f in dataclasses.fields(Settings))


@pytest.mark.parametrize("field", _fields_with("ge") + _fields_with("le"), ids=lambda f: f.name)
def test_every_declared_range_is_enforced_and_named(field):
    from ragrank.settings import bounds, env_name

    low, high = bounds(field)
    outside = (low - 1) if low is not None else (high + 1)
    with pytest.raises(SettingsError, match=env_name(field.name)):
        Settings.from_env({env_name(field.name): str(outside)})


def test_every_enumerated_setting_refuses_what_its_type_does_not_allow():
    import typing

    from ragrank.settings import choices_of, env_name

    hints = typing.get_type_hints(Settings)
    enumerated = [f for f in dataclasses.fields(Settings) if choices_of(hints[f.name])]
    assert len(enumerated) >= 11
    for field in enumerated:
        with pytest.raises(SettingsError, match=f"{env_name(field.name)} must be one of"):
            Settings.from_env({env_name(field.name): "no-such-choice"})
        for choice in choices_of(hints[field.name]):
            env = {env_name(field.name): choice}
            if field.name == "sparse" and choice == "none":
                env["RAGRANK_RETRIEVAL"] = "dense"
            assert getattr(Settings.from_env(env), field.name) == choice


def test_the_limit_tables_are_read_off_the_fields():
    from ragrank.settings import LIMIT_CEILINGS, LIMIT_FLOORS

    assert LIMIT_CEILINGS["max_top_k"] == 1_000 and LIMIT_FLOORS["max_top_k"] == 10
    assert set(LIMIT_CEILINGS) == set(LIMIT_FLOORS)
    assert "max_request_bytes" not in LIMIT_CEILINGS  # unbounded above: not a schema ceiling
