"""The client matrix's server and guards: one real `ragrank serve` on a socket, with tiny
random models and an API key, and no network beyond the loopback for the clients."""

from __future__ import annotations

import ipaddress
import os
import socket
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from eval.random_models import save_random_model, tiny_config
from tests.conftest import build_tokenizer
from tests.servers import ragrank_serve, side_by_side

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

# Each library's telemetry and remote look-ups, off before any of them is imported.
os.environ.update(
    {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # LiteLLM fetches its price list otherwise
        "LITELLM_TELEMETRY": "False",
        "HAYSTACK_TELEMETRY_ENABLED": "False",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "LANGCHAIN_TRACING_V2": "false",
        "LANGSMITH_TRACING": "false",
        "DO_NOT_TRACK": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
)

KEY = "matrix-key"
#: Low enough that a test can break them: each error test sends a query or a text past one.
MAX_QUERY_CHARS = 200
MAX_DOCUMENT_CHARS = 2_000


class Network:
    """What the clients tried to reach beyond the loopback (each attempt is refused)."""

    def __init__(self) -> None:
        self.refused: list[str] = []


NETWORK = Network()
_getaddrinfo = socket.getaddrinfo
_connect = socket.socket.connect
_connect_ex = socket.socket.connect_ex


def _loopback(host: Any) -> bool:
    if isinstance(host, bytes):
        host = host.decode()
    if host in ("localhost", None):
        return True
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False


def _refuse(host: Any) -> OSError:
    NETWORK.refused.append(str(host))
    return OSError(f"{host}: only the loopback is reachable in these tests")


def _guarded_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
    if not _loopback(host):
        NETWORK.refused.append(str(host))
        raise socket.gaierror(socket.EAI_NONAME, f"{host}: only the loopback is reachable")
    return _getaddrinfo(host, *args, **kwargs)


def _guarded_connect(self: socket.socket, address: Any) -> Any:
    if self.family in (socket.AF_INET, socket.AF_INET6) and not _loopback(address[0]):
        raise _refuse(address[0])
    return _connect(self, address)


def _guarded_connect_ex(self: socket.socket, address: Any) -> Any:
    if self.family in (socket.AF_INET, socket.AF_INET6) and not _loopback(address[0]):
        raise _refuse(address[0])
    return _connect_ex(self, address)


@pytest.fixture(scope="session", autouse=True)
def loopback_only() -> Iterator[None]:
    """Every socket the clients open goes to the loopback, or the attempt fails (and the test
    with it, unless it expects the refusal)."""
    patches = pytest.MonkeyPatch()
    # Hugging Face's offline mode refuses every URL, a TEI one on the loopback too; the guard
    # here refuses what offline mode is meant to.
    import huggingface_hub.constants

    patches.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    patches.setattr(socket, "getaddrinfo", _guarded_getaddrinfo)
    patches.setattr(socket.socket, "connect", _guarded_connect)
    patches.setattr(socket.socket, "connect_ex", _guarded_connect_ex)
    yield
    patches.undo()


@pytest.fixture(autouse=True)
def nothing_left_the_machine(request: pytest.FixtureRequest) -> Iterator[None]:
    NETWORK.refused.clear()
    yield
    if "expects_a_vendor_host" not in request.fixturenames:
        assert not NETWORK.refused, f"a client tried to reach {NETWORK.refused}"


@pytest.fixture
def expects_a_vendor_host() -> Network:
    """For a cell whose client calls its vendor's host: the test says which, and why."""
    return NETWORK


#: The name of the matrix server's second reranker, which one cell picks by `model`.
SECOND_RERANKER = "wide"


@contextmanager
def serve(
    folder: Path, embedder: Path, rerankers: tuple[Path, Path], *, keys: str
) -> Iterator[str]:
    """A real `ragrank serve` (embedded store, tiny models) with these API keys: its URL. The
    frameworks send their vendors' model names, which the default models answer to as a plain
    server's do: only the second reranker is named, for the cell that picks it."""
    env = {
        "RAGRANK_EMBED_MODEL": str(embedder),
        "RAGRANK_RERANK_MODELS": f"{rerankers[0]},{SECOND_RERANKER}={rerankers[1]}",
        "RAGRANK_QDRANT_PATH": str(folder / "qdrant"),
        "RAGRANK_JOBS_PATH": str(folder / "jobs.sqlite3"),
        "RAGRANK_DEVICE": "cpu",
        "RAGRANK_API_KEYS": keys,
        "RAGRANK_MAX_QUERY_CHARS": str(MAX_QUERY_CHARS),
        "RAGRANK_MAX_DOCUMENT_CHARS": str(MAX_DOCUMENT_CHARS),
        "RAGRANK_LOG_LEVEL": "WARNING",
    }
    with ragrank_serve([], env) as (base, _):
        yield base


@pytest.fixture(scope="session")
def spread_reranker_path(model_dir: Path) -> Path:
    """The tiny random reranker, initialised wide: its scores for different documents differ
    by far more than rounding, so a client that mixed documents up would show. (At the usual
    scale they agree to 1e-6.)"""
    folder = model_dir / "spread-bge-reranker"
    tokenizer = build_tokenizer(folder.with_name(folder.name + "-tok"))
    config = tiny_config(tokenizer)
    config.initializer_range = 1.0
    return save_random_model("reranker", config, tokenizer, folder)


@pytest.fixture(scope="session")
def second_reranker_path(model_dir: Path) -> Path:
    """A second tiny reranker, one layer and initialised wide: its order is its own."""
    folder = model_dir / "wide-one-layer-reranker"
    tokenizer = build_tokenizer(folder.with_name(folder.name + "-tok"))
    config = tiny_config(tokenizer, layers=1)
    config.initializer_range = 1.0
    return save_random_model("reranker", config, tokenizer, folder)


@pytest.fixture(scope="session")
def servers(
    tmp_path_factory: pytest.TempPathFactory,
    tiny_embedder_path: Path,
    spread_reranker_path: Path,
    second_reranker_path: Path,
) -> Iterator[dict[str, str]]:
    """Two servers, started side by side (each spends seconds importing and loading): `keyed`,
    with one API key, which every cell calls; `keyless`, for the client that sends no key."""
    rerankers = (spread_reranker_path, second_reranker_path)
    names = ("keyed", "keyless")
    managers = [
        serve(tmp_path_factory.mktemp(name), tiny_embedder_path, rerankers, keys=key)
        for name, key in zip(names, (KEY, ""), strict=True)
    ]
    with side_by_side(*managers) as bases:
        yield dict(zip(names, bases, strict=True))


@pytest.fixture(scope="session")
def ragrank(servers: dict[str, str]) -> str:
    """The server every cell calls, with one API key."""
    return servers["keyed"]


@pytest.fixture(scope="session")
def keyless(servers: dict[str, str]) -> str:
    """A server with no API keys, for the client that cannot send one."""
    return servers["keyless"]


@pytest.fixture(scope="session")
def http(ragrank: str) -> Iterator[httpx.Client]:
    """ragrank's own answers, over plain HTTP: what each client must agree with."""
    with httpx.Client(
        base_url=ragrank, headers={"Authorization": f"Bearer {KEY}"}, timeout=60
    ) as client:
        yield client
