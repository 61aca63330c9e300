"""The GPU host's kit: every wheel it carries is pinned, and its one command uses what the kit
writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from eval.bench.kit import EXTRA, RUN_SCRIPT, SERVE, pins, requirements

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("groups", [(), tuple(EXTRA)])
def test_every_kit_wheel_is_pinned_by_the_constraints(groups: tuple[str, ...]):
    specs = requirements(groups, ROOT / "constraints.txt")
    assert len(specs) == len(SERVE) + sum(len(EXTRA[g]) for g in groups)
    pinned = pins(ROOT / "constraints.txt")
    assert specs[0] == f"sentence-transformers=={pinned['sentence-transformers']}"


def test_a_package_the_constraints_lack_is_refused(tmp_path: Path):
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("transformers==5.24.0\n")
    with pytest.raises(SystemExit, match="sentence-transformers"):
        requirements((), constraints)


def test_the_run_script_installs_into_a_target_folder_and_runs_the_check():
    for part in ("--no-index", "--target", "wheels/*.whl", "ragrank.tar.xz", "shared.tar.xz"):
        assert part in RUN_SCRIPT
    assert "python3 -m eval.bench.gpu_check" in RUN_SCRIPT
