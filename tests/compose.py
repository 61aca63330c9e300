"""The compose stack as the tests read it: the file, and the services of each profile."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
PROFILES = ("cpu", "gpu", "cluster")


def compose_file() -> dict[str, Any]:
    return yaml.safe_load((REPO / "compose.yaml").read_text(encoding="utf-8"))


def profile_services(profile: str) -> dict[str, dict[str, Any]]:
    """The services `docker compose --profile <profile> up` starts."""
    return {
        name: service
        for name, service in compose_file()["services"].items()
        if not service.get("profiles") or profile in service["profiles"]
    }
