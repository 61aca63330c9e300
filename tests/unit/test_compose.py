"""The compose stack cannot run here (no Docker engine), so check what can be checked: the file's
own consistency against ragrank's CLI, settings and routes, per profile; Docker Compose's and
Caddy's own validation where `make stack-tools` fetched them (skipped otherwise); the Dockerfile."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest
import yaml

from ragrank.cli import build_parser
from ragrank.settings import settings_table
from server.routes import ROUTES

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / ".ci" / "tools" / "bin"
PROFILES = ("cpu", "gpu", "cluster")
SETTINGS = {name for name, _ in settings_table()}


def _compose() -> dict[str, Any]:
    return yaml.safe_load((REPO / "compose.yaml").read_text(encoding="utf-8"))


def _services(profile: str) -> dict[str, dict[str, Any]]:
    """The services `docker compose --profile <profile> up` starts."""
    return {
        name: service
        for name, service in _compose()["services"].items()
        if not service.get("profiles") or profile in service["profiles"]
    }


def _ragrank(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {name: service for name, service in services.items() if "build" in service}


def _host_ports(service: dict[str, Any]) -> list[str]:
    return [str(port).rsplit(":", 1)[0].split(":")[-1] for port in service.get("ports", [])]


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


def test_every_profile_has_one_qdrant_address_one_public_api_and_no_port_clash():
    for profile in PROFILES:
        services = _services(profile)
        ragrank = _ragrank(services)
        assert ragrank, profile
        ports = [port for service in services.values() for port in _host_ports(service)]
        assert len(ports) == len(set(ports)), f"{profile}: host ports clash: {ports}"
        assert "8000" in ports, f"{profile}: nothing answers on :8000"
        for name, service in ragrank.items():
            url = urlparse(service["environment"]["RAGRANK_QDRANT_URL"])
            assert url.hostname in services, f"{profile}/{name}: no Qdrant at {url.hostname}"
            assert url.port == 6333
        for name, service in services.items():
            for dependency in service.get("depends_on", {}):
                assert dependency in services, f"{profile}/{name} waits for {dependency}"


def test_every_command_is_a_real_subcommand_and_every_variable_a_real_setting():
    parser = build_parser()
    for name, service in _compose()["services"].items():
        if "build" not in service:
            continue
        args = parser.parse_args(service["command"])  # exits on an unknown subcommand or flag
        command = service["command"][0]
        for variable in service.get("environment", {}):
            if variable.startswith("RAGRANK_"):
                assert variable in SETTINGS, f"{name} sets unknown {variable}"
        if command == "serve":
            assert args.port == 8000
            assert ":8000/ready" in " ".join(service["healthcheck"]["test"])
        if command == "worker":
            assert service["environment"]["RAGRANK_WATCH"] == "/documents"
            assert "./documents:/documents:ro" in service["volumes"]
        # The API and the indexer share the job queue.
        assert "jobs:/data" in service["volumes"]
        assert service["environment"]["RAGRANK_JOBS_PATH"].startswith("/data/")
    paths = {path for route in ROUTES for path in route.paths}
    assert {"/ready", "/health"} <= paths


def test_named_volumes_are_declared_and_qdrant_nodes_are_checked_for_readiness():
    compose = _compose()
    for name, service in compose["services"].items():
        for mount in service.get("volumes", []):
            source = mount.split(":")[0]
            if not source.startswith((".", "/")):
                assert source in compose["volumes"], f"{name} mounts undeclared {source}"
        if service.get("image", "").startswith("qdrant/qdrant:"):
            assert "/readyz" in " ".join(service["healthcheck"]["test"])
            assert re.fullmatch(r"qdrant/qdrant:v\d+\.\d+\.\d+", service["image"])  # pinned


def test_the_gpu_profile_reserves_gpus_and_builds_the_cuda_image():
    for name, service in _ragrank(_services("gpu")).items():
        (device,) = service["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"], name
        assert service["build"]["args"]["VARIANT"] == "cuda"
        assert service["environment"]["RAGRANK_DEVICE"] == "cuda"
    for name, service in _ragrank(_services("cpu")).items():
        assert "deploy" not in service, name
        assert service["build"]["args"]["VARIANT"] == "cpu"
    variants = re.findall(r"^\s+(\w+)\) index=", (REPO / "Dockerfile").read_text(), re.M)
    assert sorted(variants) == ["cpu", "cuda"]


def test_the_cluster_profile_bootstraps_three_nodes_and_balances_two_replicas():
    services = _services("cluster")
    nodes = {
        name: service
        for name, service in services.items()
        if service.get("image", "").startswith("qdrant/")
    }
    assert len(nodes) == 3
    joins = {}
    for name, service in nodes.items():
        assert service["environment"]["QDRANT__CLUSTER__ENABLED"] == "true"
        command = service["command"]
        assert command[command.index("--uri") + 1] == f"http://{name}:6335"
        if "--bootstrap" in command:
            joins[name] = command[command.index("--bootstrap") + 1]
    (first,) = set(nodes) - set(joins)  # one node starts the cluster, the others join it
    assert set(joins.values()) == {f"http://{first}:6335"}

    apis = {
        name: service
        for name, service in _ragrank(services).items()
        if service["command"][0] == "serve"
    }
    ((api_name, api),) = apis.items()
    assert api["deploy"]["replicas"] >= 2
    assert not api.get("ports")  # only the load balancer is published
    environment = api["environment"]
    assert int(environment["RAGRANK_QDRANT_REPLICATION_FACTOR"].split(":-")[-1].rstrip("}")) > 1

    caddyfile = _compose()["configs"]["caddyfile"]["content"]
    assert f"dynamic a {api_name} 8000" in caddyfile
    (balancer,) = (service for service in services.values() if "configs" in service)
    assert _host_ports(balancer) == ["8000"]
    assert balancer["depends_on"][api_name]["condition"] == "service_healthy"


def test_env_example_documents_every_variable_the_compose_file_reads():
    text = (REPO / "compose.yaml").read_text(encoding="utf-8")
    read = set(re.findall(r"\$\{(\w+)", text))
    example = (REPO / ".env.example").read_text(encoding="utf-8")
    documented = set(re.findall(r"^(\w+)=", example, re.M))
    assert read <= documented, f"not in .env.example: {read - documented}"
    assert documented - read == {"COMPOSE_PROFILES"}, f"unused: {documented - read}"
    assert re.search(r"^COMPOSE_PROFILES=cpu$", example, re.M)
    for variable in documented:
        if variable.startswith("RAGRANK_"):
            assert variable in SETTINGS, variable


def test_the_dockerfile_builds_in_two_stages_and_runs_unprivileged():
    lines = (REPO / "Dockerfile").read_text(encoding="utf-8").splitlines()
    stages = [line.split()[-1] for line in lines if line.startswith("FROM ")]
    assert stages == ["build", "runtime"]
    runtime = lines[next(i for i, line in enumerate(lines) if line.endswith(" AS runtime")) :]
    (user,) = [line.split()[1] for line in runtime if line.startswith("USER ")]
    assert user.split(":")[0] not in {"0", "root"}
    assert any(line.startswith("COPY --from=build /opt/venv") for line in runtime)
    ignored = (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
    kept = {line[1:].rstrip("/") for line in ignored if line.startswith("!")}
    for line in lines:
        if line.startswith("COPY ") and "--from" not in line:
            for source in line.split()[1:-1]:
                assert (REPO / source).exists() and source in kept, source


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
    assert set(result.stdout.split()) == set(_services(profile))


def _caddy() -> str:
    caddy = _tool("caddy")
    if caddy is None:
        pytest.skip("no Caddy here: `make stack-tools` fetches one")
    version = subprocess.run([caddy, "version"], capture_output=True, text=True, check=True)
    (balancer,) = (s for s in _compose()["services"].values() if "configs" in s)
    assert version.stdout.lstrip("v").startswith(balancer["image"].split(":")[1].split("-")[0])
    return caddy


def test_caddy_accepts_the_load_balancer_config(tmp_path: Path):
    caddy = _caddy()
    caddyfile = tmp_path / "Caddyfile"
    caddyfile.write_text(_compose()["configs"]["caddyfile"]["content"], encoding="utf-8")
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


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


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
    listen = _free_port()
    config = _compose()["configs"]["caddyfile"]["content"]
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
