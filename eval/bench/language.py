"""Language identification as BM25 uses it: accuracy and cost per text on each XQuAD-R
language's passages and questions and on SciFact, and what the misses were taken for.

    python -m eval.bench.language

A text counts as right when `ragrank.language.detect` names its folder's language (dialects
already merged, as indexing sees them). The confidence split shows what a query's
low-confidence rule (`RAGRANK_BM25_QUERY_CONFIDENCE`) catches: the share of wrong and of
right questions below each threshold.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from eval.bench.options import LanguageBenchOptions
from ragrank.beir import load_queries
from ragrank.documents import read_jsonl_documents
from ragrank.language import DETECTOR, detect
from ragrank.options import parse_options

if TYPE_CHECKING:
    from pathlib import Path

THRESHOLDS = (0.3, 0.5, 0.7, 0.9)


def _sets(args: LanguageBenchOptions) -> dict[str, tuple[str, list[str]]]:
    sets: dict[str, tuple[str, list[str]]] = {}
    for folder in sorted(p for p in args.xquad.iterdir() if (p / "queries.jsonl").exists()):
        corpus = next(folder.glob("corpus.jsonl*"))
        passages = [d.passage for d in read_jsonl_documents(corpus)]
        sets[f"{folder.name} passages"] = (folder.name, passages[: args.limit])
        questions = list(load_queries(folder / "queries.jsonl").values())
        sets[f"{folder.name} questions"] = (folder.name, questions[: args.limit])
    if args.scifact.exists():
        corpus = next(args.scifact.glob("corpus.jsonl*"))
        abstracts = [d.passage for d in read_jsonl_documents(corpus)]
        sets["scifact abstracts"] = ("en", abstracts[: args.limit])
        claims = list(load_queries(args.scifact / "queries.jsonl").values())
        sets["scifact claims"] = ("en", claims[: args.limit])
    return sets


def measure(name: str, language: str, texts: list[str]) -> dict[str, Any]:
    started = time.perf_counter()
    guesses = [detect(text) for text in texts]
    seconds = time.perf_counter() - started
    right = [g.confidence for g in guesses if g.language == language]
    wrong = [g.confidence for g in guesses if g.language != language]
    return {
        "set": name,
        "texts": len(texts),
        "accuracy": round(len(right) / len(texts), 4),
        "ms_per_text": round(seconds * 1000 / len(texts), 3),
        "taken_for": dict(Counter(g.language for g in guesses if g.language != language)),
        "below": {
            str(t): {
                "wrong": round(sum(c < t for c in wrong) / max(len(wrong), 1), 3),
                "right": round(sum(c < t for c in right) / max(len(right), 1), 3),
            }
            for t in THRESHOLDS
        },
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_options(
        LanguageBenchOptions, argv, prog="python -m eval.bench.language", description=__doc__
    )
    detect("warm-up")  # loads the model, once
    rows = [measure(name, lang, texts) for name, (lang, texts) in _sets(args).items()]
    print(f"{DETECTOR}: accuracy, ms per text, share of misses / hits below confidence 0.5")
    for row in rows:
        below = row["below"]["0.5"]
        common = ", ".join(f"{k} {v}" for k, v in Counter(row["taken_for"]).most_common(3))
        print(
            f"{row['set']:<20} {row['texts']:>5}  {row['accuracy']:.3f}  "
            f"{row['ms_per_text']:.2f} ms  {below['wrong']:.2f} / {below['right']:.2f}  {common}"
        )
    if args.out is not None:
        _write(args.out, {"detector": DETECTOR, "sets": rows})
    return 0


def _write(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    raise SystemExit(main())
