"""The compose stack cannot run here (no Docker engine), so check what can be checked: the file's
own consistency against ragrank's CLI, settings and routes, per profile; Docker Compose's and
Caddy's own validation where `make stack-tools` fetched them (skipped otherwise); the Dockerfile."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlparse

from cli import build_parser
from ragrank.settings import settings_table
from server.routes import health
from tests.compose import PROFILES, REPO, compose_file, profile_services

SETTINGS = {name for name, _ in settings_table()}


def _ragrank(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {name: service for name, service in services.items() if "build" in service}


def _host_ports(service: dict[str, Any]) -> list[str]:
    return [str(port).rsplit(":", 1)[0].split(":")[-1] for port in service.get("ports", [])]


def test_every_profile_has_one_qdrant_address_one_public_api_and_no_port_clash():
    for profile in PROFILES:
        services = profile_services(profile)
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
    for name, service in compose_file()["services"].items():
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
    paths = {route.path for route in health.router.routes}
    assert {"/ready", "/health"} <= paths


def test_named_volumes_are_declared_and_qdrant_nodes_are_checked_for_readiness():
    compose = compose_file()
    for name, service in compose["services"].items():
        for mount in service.get("volumes", []):
            source = mount.split(":")[0]
            if not source.startswith((".", "/")):
                assert source in compose["volumes"], f"{name} mounts undeclared {source}"
        if service.get("image", "").startswith("qdrant/qdrant:"):
            assert "/readyz" in " ".join(service["healthcheck"]["test"])
            assert re.fullmatch(r"qdrant/qdrant:v\d+\.\d+\.\d+", service["image"])  # pinned


def test_the_gpu_profile_reserves_gpus_and_builds_the_cuda_image():
    for name, service in _ragrank(profile_services("gpu")).items():
        (device,) = service["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"], name
        assert service["build"]["args"]["VARIANT"] == "cuda"
        assert service["environment"]["RAGRANK_DEVICE"] == "cuda"
    for name, service in _ragrank(profile_services("cpu")).items():
        assert "deploy" not in service, name
        assert service["build"]["args"]["VARIANT"] == "cpu"
    variants = re.findall(r"^\s+(\w+)\) index=", (REPO / "Dockerfile").read_text(), re.M)
    assert sorted(variants) == ["cpu", "cuda"]


def test_the_cluster_profile_bootstraps_three_nodes_and_balances_two_replicas():
    services = profile_services("cluster")
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

    caddyfile = compose_file()["configs"]["caddyfile"]["content"]
    assert f"dynamic a {api_name} 8000" in caddyfile
    (balancer,) = (service for service in services.values() if "configs" in service)
    assert _host_ports(balancer) == ["8000"]
    assert balancer["depends_on"][api_name]["condition"] == "service_healthy"


def test_the_cluster_profile_runs_its_replicas_and_two_workers_on_one_postgres_queue():
    services = profile_services("cluster")
    (database,) = (s for s in services.values() if s.get("image", "").startswith("postgres:"))
    assert "pg_isready" in database["healthcheck"]["test"]
    assert any(mount.endswith(":/var/lib/postgresql/data") for mount in database["volumes"])
    (name,) = (n for n, s in services.items() if s is database)
    ragrank = _ragrank(services)
    workers = [s for s in ragrank.values() if s["command"][0] == "worker"]
    assert sum(s.get("deploy", {}).get("replicas", 1) for s in workers) >= 2
    for service_name, service in ragrank.items():
        url = service["environment"]["RAGRANK_JOBS_URL"]
        assert url.startswith("postgresql://"), service_name
        assert url.rsplit("@", 1)[-1].startswith(f"{name}:5432/"), service_name
    api = next(s for s in ragrank.values() if s["command"][0] == "serve")
    assert api["depends_on"][name]["condition"] == "service_healthy"
    for profile in ("cpu", "gpu"):  # one machine: the SQLite queue on the shared volume
        for service in _ragrank(profile_services(profile)).values():
            assert "RAGRANK_JOBS_URL" not in service["environment"]


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
