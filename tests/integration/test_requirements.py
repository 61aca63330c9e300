"""faiss's CPU and GPU builds never land in one environment: they install the same `faiss`
module, so the second one installed silently replaces files of the first. Checked where an
environment is made (`make setup`, with and without a GPU, and the image's two variants), in
the pinned requirements, and in this environment itself."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from eval.exact import FAISS_DISTRIBUTIONS, FaissConflictError, faiss_build, installed_versions

ROOT = Path(__file__).resolve().parents[2]
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def packages_of(extras: set[str]) -> set[str]:
    """The distributions ragrank's extras name, its own extras (`ragrank[x]`) expanded."""
    names: set[str] = set()
    pending, seen = list(extras), set()
    while pending:
        extra = pending.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for line in EXTRAS[extra]:
            requirement = Requirement(line)
            if requirement.name == "ragrank":
                pending += requirement.extras
            else:
                names.add(requirement.name)
    return names


def faiss_of(extras: set[str]) -> set[str]:
    return packages_of(extras) & set(FAISS_DISTRIBUTIONS)


def setup_extras(nvidia_smi: str) -> set[str]:
    """The extras `make setup` installs, read from its dry run with nvidia-smi faked."""
    dry_run = subprocess.run(
        ["make", "-n", "-B", "setup", "VENV=/nonexistent-venv", f"NVIDIA_SMI={nvidia_smi}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (extras,) = re.findall(r"pip install -c constraints\.txt -e '\.\[([a-z,-]+)\]'", dry_run)
    return set(extras.split(","))


def test_the_helper_sees_both_builds_where_two_extras_would_bring_both():
    # What the checks below rule out, so that they can fail: `eval` and `gpu` together.
    assert faiss_of({"eval", "gpu"}) == {"faiss-cpu", "faiss-gpu"}
    assert faiss_of({"finetune"}) == set()  # the trainers bring no faiss of their own


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize(("nvidia_smi", "build"), [("true", "faiss-gpu"), ("false", "faiss-cpu")])
def test_make_setup_installs_one_faiss_build_the_gpu_one_where_nvidia_smi_lists_a_gpu(
    nvidia_smi, build
):
    extras = setup_extras(nvidia_smi)
    assert faiss_of(extras) == {build}
    assert {"ranx", "matplotlib", "datasets", "accelerate", "pytest"} <= packages_of(extras)


def test_the_cuda_image_installs_faiss_gpu_and_the_cpu_image_no_faiss():
    dockerfile = (ROOT / "Dockerfile").read_text()
    targets = dict(re.findall(r'(\w+)\) target="\.(?:\[([a-z,-]+)\])?"', dockerfile))
    assert set(targets) == {"cpu", "cuda"}
    assert faiss_of(set(filter(None, targets["cpu"].split(",")))) == set()
    assert faiss_of(set(targets["cuda"].split(","))) == {"faiss-gpu"}


def test_the_pins_bring_faiss_only_through_ragrank_s_own_extras():
    """Nothing else in the pinned set depends on a faiss build, so the extras above are the
    whole story; both builds are pinned, for the CPU and the CUDA environments."""
    pins = (ROOT / "constraints.txt").read_text()
    for name in ("faiss-cpu", "faiss-gpu"):
        block = re.search(rf"^{name}==[^\n]+\n((?:    [^\n]*\n)+)", pins, re.MULTILINE)
        assert block is not None, f"{name} is not pinned in constraints.txt"
        assert block.group(1).strip() == "# via ragrank (pyproject.toml)"


def test_this_environment_has_one_faiss_build():
    installed = list(installed_versions(FAISS_DISTRIBUTIONS))
    assert len(installed) == 1, installed
    assert faiss_build().distribution == installed[0]


def test_two_builds_installed_are_refused_by_name(monkeypatch):
    monkeypatch.setattr(metadata, "version", lambda name: "1.15.1")
    with pytest.raises(FaissConflictError, match="faiss-cpu and faiss-gpu and faiss-gpu-cu12"):
        faiss_build()


def test_ragrank_eval_with_two_builds_installed_stops_before_loading_a_model(
    monkeypatch, capsys, tmp_path
):
    from cli import main

    monkeypatch.setattr(metadata, "version", lambda name: "1.15.1")
    assert main(["eval", "--dataset", str(tmp_path), "--embed-model", "no/such-model"]) == 2
    assert "share the faiss module" in capsys.readouterr().err


def test_the_cpu_image_and_make_setup_bring_what_the_cpu_default_backends_need():
    """What `auto` picks on a CPU with the `small` preset must be installed where that runs:
    the CPU image and `make setup`; the image's model loads are checked in
    test_openvino.py::test_the_small_preset_runs_its_cpu_backends_here."""
    from ragrank.backends.openvino import DISTRIBUTIONS
    from ragrank.settings import PRESET_CPU_BACKENDS

    needed = {name for backend in PRESET_CPU_BACKENDS["small"] for name in DISTRIBUTIONS[backend]}
    assert needed, "the small preset's CPU default needs OpenVINO"
    dockerfile = (ROOT / "Dockerfile").read_text()
    targets = dict(re.findall(r'(\w+)\) target="\.(?:\[([a-z,-]+)\])?"', dockerfile))
    assert needed <= packages_of(set(filter(None, targets["cpu"].split(","))))
    assert needed <= packages_of(setup_extras("false"))
    pins = (ROOT / "constraints.txt").read_text()
    assert all(re.search(rf"^{name}==", pins, re.MULTILINE) for name in needed)
