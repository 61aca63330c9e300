"""Docker Compose's and Caddy's own validation of the stack's files, where `make stack-tools`
fetched them (skipped otherwise), and the load balancer's config in front of two stand-in
replicas."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

import httpx
import pytest

from eval.bench.harness import free_port
from tests.compose import PROFILES, REPO, compose_file, profile_services

if TYPE_CHECKING:
    from pathlib import Path

#: Where `make stack-tools` puts Docker Compose and Caddy.
TOOLS = REPO / ".ci" / "tools" / "bin"


def _tool(name: str) -> str | None:
    """A validating program: from `make stack-tools`, or on PATH (Compose only if v2)."""
    for candidate in (TOOLS / name, shutil.which(name)):
        if candidate and os.access(candidate, os.X_OK):
            if name == "docker-compose":
                version = subprocess.run(
                    [str(candidate), "version"], capture_output=True, text=True, check=False
                )
                if not re.search(r"version v?2\.", version.stdout):
                    continue  # Compose v1 rejects the Compose spec's top-level `name:`
            return str(candidate)
    return None


@pytest.mark.parametrize("profile", PROFILES)
def test_docker_compose_accepts_each_profile(profile: str):
    compose = _tool("docker-compose")
    if compose is None:
        pytest.skip("no Docker Compose v2 here: `make stack-tools` fetches one")
    result = subprocess.run(
        [compose, "--profile", profile, "config", "--services"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "COMPOSE_PROFILES": ""},
    )
    assert result.returncode == 0, result.stderr
    assert set(result.stdout.split()) == set(profile_services(profile))


def _caddy() -> str:
    caddy = _tool("caddy")
    if caddy is None:
        pytest.skip("no Caddy here: `make stack-tools` fetches one")
    version = subprocess.run([caddy, "version"], capture_output=True, text=True, check=True)
    (balancer,) = (s for s in compose_file()["services"].values() if "configs" in s)
    assert version.stdout.lstrip("v").startswith(balancer["image"].split(":")[1].split("-")[0])
    return caddy


def test_caddy_accepts_the_load_balancer_config(tmp_path: Path):
    caddy = _caddy()
    caddyfile = tmp_path / "Caddyfile"
    caddyfile.write_text(compose_file()["configs"]["caddyfile"]["content"], encoding="utf-8")
    result = subprocess.run(
        [caddy, "validate", "--config", str(caddyfile), "--adapter", "caddyfile"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]


class _Replica(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        answer = self.server.server_address[1].to_bytes(2, "big") + body  # type: ignore[union-attr]
        self.send_response(200)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:
        pass


def test_the_load_balancer_alternates_replicas_and_retries_a_post_on_the_live_one(
    tmp_path: Path,
):
    """The compose file's Caddy config with two local stand-in replicas in place of the DNS
    name: requests alternate; with one replica gone, POSTs (bodies included) reach the other."""
    caddy = _caddy()
    replicas = [ThreadingHTTPServer(("127.0.0.1", 0), _Replica) for _ in range(2)]
    for replica in replicas:
        threading.Thread(target=replica.serve_forever, daemon=True).start()
    ports = [replica.server_address[1] for replica in replicas]
    listen = free_port()
    config = compose_file()["configs"]["caddyfile"]["content"]
    config = re.sub(
        r"dynamic a api-replica 8000 \{.*?\}",
        "to " + " ".join(f"127.0.0.1:{port}" for port in ports),
        config,
        flags=re.S,
    ).replace(":8000 {", f":{listen} {{\n  bind 127.0.0.1")
    (tmp_path / "Caddyfile").write_text(config, encoding="utf-8")
    process = subprocess.Popen(
        [caddy, "run", "--config", "Caddyfile", "--adapter", "caddyfile"],
        cwd=tmp_path,
        env={**os.environ, "HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def post(body: bytes) -> tuple[int, int]:
        answer = httpx.post(f"http://127.0.0.1:{listen}/v1/rerank", content=body, timeout=10)
        assert answer.status_code == 200 and answer.content[2:] == body, answer.text
        return int.from_bytes(answer.content[:2], "big"), answer.status_code

    try:
        for _ in range(100):  # wait for Caddy to listen
            with contextlib.suppress(httpx.TransportError):
                httpx.get(f"http://127.0.0.1:{listen}/", timeout=1)
                break
            time.sleep(0.05)
        served = [post(b'{"query": "q%d"}' % i)[0] for i in range(6)]
        assert sorted(served) == sorted(ports * 3)
        replicas[1].shutdown()
        replicas[1].server_close()
        served = [post(b'{"query": "after %d"}' % i)[0] for i in range(6)]
        assert served == [ports[0]] * 6
    finally:
        process.terminate()
        process.wait(timeout=10)
        replicas[0].shutdown()
