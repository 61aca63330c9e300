"""Retrieval metrics and paired comparisons, computed by ranx (metrics, significance tests,
wins/ties/losses) and scipy (bootstrap confidence intervals). Inputs are never mutated."""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy import stats

if TYPE_CHECKING:
    from ragrank.beir import Qrels

#: query id → document id → score, as a run is written in TREC and ranx.
Run = Mapping[str, Mapping[str, float]]

HEADLINE = "ndcg@10"
METRICS = ("ndcg@10", "recall@10", "recall@100", "mrr@10", "map@100")
#: Fisher's randomisation test is the paired test IR evaluation recommends (Smucker et al.
#: 2007); Student's paired t-test is reported beside it.
STAT_TESTS = ("fisher", "student")
PERMUTATIONS = 10_000
BOOTSTRAP_RESAMPLES = 10_000
CONFIDENCE = 0.95
#: A difference is called significant below this p-value.
ALPHA = 1 - CONFIDENCE
SEED = 0


@dataclass(frozen=True)
class SystemScores:
    """Mean of each metric, the per-query values of each, and the headline's 95 % CI."""

    means: dict[str, float]
    per_query: dict[str, dict[str, float]]
    headline_ci: tuple[float, float]


@dataclass(frozen=True)
class Comparison:
    """`challenger` against `baseline` on the same queries: positive deltas favour the
    challenger. Wins, ties and losses count queries by the headline metric."""

    baseline: str
    challenger: str
    delta: dict[str, float]
    delta_ci: dict[str, tuple[float, float]]
    p_values: dict[str, dict[str, float]]
    wins: int
    ties: int
    losses: int


def _ranx() -> Any:
    # ranx compiles its metrics with numba on first use; keep that off import paths.
    import ranx

    return ranx


@contextmanager
def _quiet_compilation() -> Iterator[None]:
    """numba warns about an unsafe integer cast while it compiles ranx's metrics (once per
    installation, then cached); it concerns ranx's internals, not these results."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="unsafe cast from uint64 to int64")
        yield


def score_run(qrels: Qrels, run: Run, name: str) -> SystemScores:
    """Every metric of `METRICS` for one run, over exactly the queries in `qrels` (a query
    the run misses scores 0)."""
    ranx = _ranx()
    ranx_run = ranx.Run(_complete(qrels, run), name=name)
    with _quiet_compilation():
        means = ranx.evaluate(_qrels(qrels), ranx_run, list(METRICS))
    per_query = {
        metric: {qid: float(value) for qid, value in ranx_run.scores[metric].items()}
        for metric in METRICS
    }
    values = np.array([per_query[HEADLINE][qid] for qid in qrels])
    return SystemScores(
        means={metric: float(means[metric]) for metric in METRICS},
        per_query=per_query,
        headline_ci=bootstrap_ci(values),
    )


def oracle_ndcg(qrels: Qrels, run: Run, k: int) -> float:
    """Mean NDCG@10 of the best reordering of each query's top `k` documents in `run`, the
    rest kept below in the run's order: the most a reranker of those `k` candidates could
    reach (as `reranked` keeps the first stage's order past its candidates)."""
    ideal = {}
    complete = _complete(qrels, run)
    for qid in qrels:
        ranking = list(complete[qid])
        grades = qrels[qid]
        # The top k by grade, ties in the run's order; then the rest, in the run's order.
        ideal[qid] = {
            doc_id: (
                float(len(ranking) + grades.get(doc_id, 0) * (k + 1) + (k - position))
                if position < k
                else float(len(ranking) - position)
            )
            for position, doc_id in enumerate(ranking)
        }
    ranx = _ranx()
    with _quiet_compilation():
        return float(ranx.evaluate(_qrels(qrels), ranx.Run(_complete(qrels, ideal)), HEADLINE))


def compare(
    qrels: Qrels, runs: Mapping[str, Run], scores: Mapping[str, SystemScores], baseline: str
) -> list[Comparison]:
    """Each other run against `baseline`: deltas with bootstrap CIs, p-values of both paired
    tests for every metric, and per-query wins, ties and losses on the headline metric.

    ranx.compare tests every ordered pair of the runs it is given (n squared tests of
    `PERMUTATIONS` each, most of them between two challengers) and seeds each test alike, so
    each challenger is compared with the baseline alone: the same p-values, from one test a
    challenger."""
    ranx = _ranx()
    ranx_qrels = _qrels(qrels)
    control = ranx.Run(_complete(qrels, runs[baseline]), name=baseline)
    reports: dict[str, dict[str, Any]] = {test: {} for test in STAT_TESTS}
    with _quiet_compilation():
        for challenger, run in runs.items():
            if challenger == baseline:
                continue
            pair = [control, ranx.Run(_complete(qrels, run), name=challenger)]
            for test in STAT_TESTS:
                reports[test][challenger] = ranx.compare(
                    ranx_qrels,
                    pair,
                    metrics=list(METRICS),
                    stat_test=test,
                    n_permutations=PERMUTATIONS,
                    random_seed=SEED,
                ).to_dict()[challenger]
    comparisons = []
    for challenger in runs:
        if challenger == baseline:
            continue
        deltas = {
            metric: np.array(
                [
                    scores[challenger].per_query[metric][qid]
                    - scores[baseline].per_query[metric][qid]
                    for qid in qrels
                ]
            )
            for metric in METRICS
        }
        wtl = reports["fisher"][challenger]["win_tie_loss"][baseline][HEADLINE]
        comparisons.append(
            Comparison(
                baseline=baseline,
                challenger=challenger,
                delta={metric: float(d.mean()) for metric, d in deltas.items()},
                delta_ci={metric: bootstrap_ci(d) for metric, d in deltas.items()},
                p_values={
                    test: {
                        metric: float(report[challenger]["comparisons"][baseline][metric])
                        for metric in METRICS
                    }
                    for test, report in reports.items()
                },
                wins=int(wtl["W"]),
                ties=int(wtl["T"]),
                losses=int(wtl["L"]),
            )
        )
    return comparisons


def format_p(p: float) -> str:
    """A p-value to four places; a randomisation test cannot resolve below 1/permutations."""
    return f"{p:.4f}" if p >= 1e-4 else "< 0.0001"


def bootstrap_ci(values: np.ndarray) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of the mean, resampling queries (seeded)."""
    if len(values) < 2 or np.ptp(values) == 0:
        mean = float(values.mean()) if len(values) else 0.0
        return mean, mean
    result = stats.bootstrap(
        (values,),
        np.mean,
        confidence_level=CONFIDENCE,
        n_resamples=BOOTSTRAP_RESAMPLES,
        method="percentile",
        rng=np.random.default_rng(SEED),
    )
    interval = result.confidence_interval
    return float(interval.low), float(interval.high)


def paired_tests(deltas: np.ndarray) -> dict[str, float]:
    """Two-sided p-values of per-query deltas (challenger - baseline) pooled over datasets:
    Fisher's randomisation test (signs flipped at random, seeded, as ranx's `fisher`) and
    Student's paired t-test."""
    if len(deltas) < 2 or (np.ptp(deltas) == 0 and deltas[0] == 0):
        return dict.fromkeys(STAT_TESTS, 1.0)
    fisher = stats.permutation_test(
        (deltas,),
        np.mean,
        permutation_type="samples",
        n_resamples=PERMUTATIONS,
        alternative="two-sided",
        rng=np.random.default_rng(SEED),
    )
    student = stats.ttest_1samp(deltas, 0.0)
    return {"fisher": float(fisher.pvalue), "student": float(student.pvalue)}


def _qrels(qrels: Qrels) -> Any:
    return _ranx().Qrels({qid: dict(docs) for qid, docs in qrels.items()})


def _complete(qrels: Qrels, run: Run) -> dict[str, dict[str, float]]:
    """The run restricted to the judged queries, with an empty ranking for any it lacks.
    ranx breaks score ties by insertion order, so each ranking is inserted by descending
    score, then document id: equal scores rank the same whichever system produced them."""
    return {
        qid: dict(sorted(run.get(qid, {}).items(), key=lambda item: (-item[1], item[0])))
        for qid in qrels
    }
