"""`make gpu-kit DIR=…`: everything an air-gapped GPU host with a stock CUDA PyTorch image
(Python 3.12, torch, transformers, sentence-transformers and the scientific stack, no network)
needs to serve ragrank and to run `make gpu-check`, in one folder of at most 48 MiB:

- `wheels/`: the Python 3.12 manylinux wheels of what such an image lacks, at the versions
  `constraints.txt` pins (newer transformers, tokenizers and huggingface_hub shadow the
  image's older ones once installed into the target folder);
- `ragrank.tar.xz`: the project's code at the current commit (docs' pictures left out);
- `shared.tar.xz`: SciFact and the shared model configs and tokenizers, which the benchmarks
  read beside the repository;
- `run-gpu-check.sh`: the one command to run there.

On the host: `bash KIT/run-gpu-check.sh [OUT]` installs the wheels into a target folder
(`RAGRANK_SITE`, default /tmp/ragrank-site), unpacks the code and the data, and runs the check.
Left out for size: faiss (the eval's exact search; faiss-gpu's wheel alone is 135 MB: the
check then reports it as not installed), ranx and its readers (offline metrics), and psycopg
(the PostgreSQL job queue): `--with postgres,eval` adds them when the size allows.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from eval.bench.options import SHARED_DIR

#: What a stock CUDA PyTorch image lacks that ragrank's server and `make gpu-check` import.
SERVE = (
    "sentence-transformers",
    "transformers",
    "tokenizers",
    "huggingface-hub",
    "qdrant-client",
    "qdrant-edge-py",
    "litestar",
    "litestar-htmx",
    "rich-click",
    "msgspec",
    "multipart",
    "polyfactory",
    "faker",
    "tzdata",
    "pydantic",
    "pydantic-core",
    "annotated-types",
    "typing-inspection",
    "uvicorn",
    "py3langid",
    "orjson",
    "sniffio",
    "h2",
    "hpack",
    "hyperframe",
    "httpx2",
    "httpcore2",
    "truststore",
    "pytest-asyncio",
)
#: Optional groups, by `--with` name.
EXTRA = {
    "postgres": ("psycopg", "psycopg-binary", "psycopg-pool"),
    "eval": (
        "faiss-cpu",
        "ranx",
        "ir-datasets",
        "fastparquet",
        "cramjam",
        "cbor2",
        "lz4",
    ),
}
LIMIT_BYTES = 48 * 1024 * 1024
#: The shared folders the benchmarks read.
SHARED = (
    "data/scifact",
    "models/bge-reranker-v2-m3",
    "models/multilingual-e5-base",
    "models/ms-marco-MiniLM-L-6-v2-noweights",
    "models/xlm-roberta-tokenizer",
)
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)

RUN_SCRIPT = """#!/usr/bin/env bash
# Install the kit's wheels into a target folder and run `make gpu-check` on this GPU host.
set -euo pipefail
KIT=$(cd "$(dirname "$0")" && pwd)
SITE=${RAGRANK_SITE:-/tmp/ragrank-site}
OUT=${1:-$KIT/gpu-check}
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$KIT"/wheels/*.whl
mkdir -p "$KIT/src"
tar -xJf "$KIT/ragrank.tar.xz" -C "$KIT/src"
tar -xJf "$KIT/shared.tar.xz" -C "$KIT"
# The benchmarks read the XLM-R tokenizer gzipped, as the shared folder keeps it.
TOKENIZER="$KIT/shared/models/xlm-roberta-tokenizer/tokenizer.json"
if [ -f "$TOKENIZER" ]; then gzip -1 -f "$TOKENIZER"; fi
cd "$KIT/src"
export PYTHONPATH="$SITE:$KIT/src" RAGRANK_SHARED_DIR="$KIT/shared" HF_HUB_OFFLINE=1
python3 -m eval.bench.gpu_check --out "$OUT" "${@:2}"
"""


def pins(constraints: Path) -> dict[str, str]:
    """Pinned versions by normalised name (PEP 503)."""
    found = {}
    for line in constraints.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)", line)
        if match:
            found[_normalised(match.group(1))] = match.group(2)
    return found


def _normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(groups: tuple[str, ...], constraints: Path) -> list[str]:
    """`name==version` of each wheel the kit carries."""
    pinned = pins(constraints)
    names = [*SERVE, *(n for g in groups for n in EXTRA[g])]
    missing = [n for n in names if _normalised(n) not in pinned]
    if missing:
        raise SystemExit(f"constraints.txt pins none of: {', '.join(missing)}")
    return [f"{n}=={pinned[_normalised(n)]}" for n in names]


def download(specs: list[str], wheels: Path) -> None:
    """Python 3.12 manylinux wheels, no dependencies (the list is complete by itself)."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    command += ["--python-version", "3.12", "--implementation", "cp", "-d", str(wheels)]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    subprocess.run([*command, *specs], check=True)


def pack(folder: Path, members: list[tuple[Path, str]], *, unzip_gz: bool = False) -> None:
    """An xz tarball of `members` (path, name inside); `.gz` files stored unpacked when
    `unzip_gz`, since xz compresses them a third smaller than gzip does."""
    import gzip

    with tarfile.open(folder, "w:xz", preset=9) as tar:
        for path, name in members:
            if unzip_gz and path.is_file() and path.suffix == ".gz":
                with tempfile.NamedTemporaryFile() as plain:
                    with gzip.open(path, "rb") as source:
                        shutil.copyfileobj(source, plain)
                    plain.flush()
                    tar.add(plain.name, arcname=name.removesuffix(".gz"))
                continue
            tar.add(path, arcname=name)


def build(out: Path, groups: tuple[str, ...]) -> int:
    root = Path(__file__).resolve().parents[2]
    out.mkdir(parents=True, exist_ok=True)
    download(requirements(groups, root / "constraints.txt"), out / "wheels")
    with tempfile.TemporaryDirectory() as scratch:
        archive = Path(scratch) / "code.tar"
        subprocess.run(
            [
                "git",
                "archive",
                "--format=tar",
                "-o",
                str(archive),
                "HEAD",
                "--",
                ".",
                ":!docs/*.png",
            ],
            cwd=root,
            check=True,
        )
        with tarfile.open(archive) as tar:
            tar.extractall(Path(scratch) / "code", filter="data")
        code = Path(scratch) / "code"
        pack(out / "ragrank.tar.xz", [(p, p.name) for p in sorted(code.iterdir())])
    shared = [p for name in SHARED for p in sorted((SHARED_DIR / name).rglob("*")) if p.is_file()]
    pack(
        out / "shared.tar.xz",
        [(p, "shared/" + str(p.relative_to(SHARED_DIR))) for p in shared],
        unzip_gz=True,
    )
    script = out / "run-gpu-check.sh"
    script.write_text(RUN_SCRIPT)
    script.chmod(0o755)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file() and p.parent.name != "src")
    print(f"wrote {out}: {size / 2**20:.1f} MiB (limit {LIMIT_BYTES / 2**20:.0f} MiB)")
    return 0 if size <= LIMIT_BYTES else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.bench.kit", description=__doc__)
    parser.add_argument("out", type=Path, help="the kit's folder")
    parser.add_argument(
        "--with", dest="groups", default="", help=f"optional groups: {', '.join(EXTRA)}"
    )
    args = parser.parse_args(argv)
    groups = tuple(g for g in args.groups.split(",") if g)
    unknown = [g for g in groups if g not in EXTRA]
    if unknown:
        parser.error(f"--with: unknown group {unknown[0]!r}; choose from {', '.join(EXTRA)}")
    return build(args.out, groups)


if __name__ == "__main__":
    raise SystemExit(main())
