"""compose.yaml cannot be run here (no Docker engine), so check what can be checked statically."""

from __future__ import annotations

from pathlib import Path

import yaml

from ragrank.cli import build_parser
from ragrank.settings import settings_table

REPO = Path(__file__).resolve().parents[2]


def _compose() -> dict:
    return yaml.safe_load((REPO / "compose.yaml").read_text(encoding="utf-8"))


def test_every_service_command_is_a_real_subcommand_and_every_variable_a_real_setting():
    compose = _compose()
    parser = build_parser()
    settings = {name for name, _ in settings_table()}
    for name, service in compose["services"].items():
        if "build" in service:
            parser.parse_args(service["command"])  # exits on an unknown subcommand or flag
        for variable in service.get("environment", {}):
            if variable.startswith("RAGRANK_"):
                assert variable in settings, f"{name} sets unknown {variable}"


def test_named_volumes_are_declared_and_dependencies_exist():
    compose = _compose()
    services = compose["services"]
    for service in services.values():
        for mount in service.get("volumes", []):
            source = mount.split(":")[0]
            if not source.startswith((".", "/")):
                assert source in compose["volumes"]
        for dependency in service.get("depends_on", {}):
            assert dependency in services
    assert "healthcheck" in services["qdrant"]
    assert "/readyz" in " ".join(services["qdrant"]["healthcheck"]["test"])
    assert (REPO / "Dockerfile").exists()
