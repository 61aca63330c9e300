"""The eval suite's metrics against trec_eval (through pytrec_eval), an implementation
independent of ranx, on random graded qrels and runs; and the paired comparisons."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import pytrec_eval

from eval.metrics import METRICS, bootstrap_ci, compare, oracle_ndcg, score_run

# ranx name → trec_eval measure; MRR@10 is trec_eval's reciprocal rank over the top 10.
TREC_MEASURES = {
    "ndcg@10": "ndcg_cut_10",
    "recall@10": "recall_10",
    "recall@100": "recall_100",
    "map@100": "map_cut_100",
}


def random_collection(seed: int, queries: int = 40, documents: int = 150):
    rng = random.Random(seed)
    qrels = {}
    for q in range(queries):
        judged = rng.sample(range(documents), rng.randint(1, 8))
        # Grades 0..3; 0 is a judged non-relevant document. Some queries have none relevant.
        qrels[f"q{q}"] = {f"d{d}": rng.choice([0, 0, 1, 2, 3]) for d in judged}
    run = {
        qid: {f"d{d}": rng.random() for d in rng.sample(range(documents), rng.randint(5, 120))}
        for qid in qrels
    }
    return qrels, run


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metrics_agree_with_trec_eval_on_random_runs(seed: int):
    qrels, run = random_collection(seed)
    scores = score_run(qrels, run, "random")

    evaluator = pytrec_eval.RelevanceEvaluator(qrels, set(TREC_MEASURES.values()))
    reference = evaluator.evaluate(run)
    top10 = {
        qid: dict(sorted(docs.items(), key=lambda item: -item[1])[:10]) for qid, docs in run.items()
    }
    reference_rr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(top10)

    for metric, measure in TREC_MEASURES.items():
        for qid in qrels:
            assert scores.per_query[metric][qid] == pytest.approx(reference[qid][measure], abs=1e-9)
        expected = np.mean([reference[qid][measure] for qid in qrels])
        assert scores.means[metric] == pytest.approx(expected, abs=1e-9)
    for qid in qrels:
        assert scores.per_query["mrr@10"][qid] == pytest.approx(
            reference_rr[qid]["recip_rank"], abs=1e-9
        )
    assert set(scores.means) == set(METRICS)


def test_a_query_missing_from_the_run_scores_zero_and_inputs_are_untouched():
    qrels, run = random_collection(3, queries=5)
    partial = {qid: docs for qid, docs in run.items() if qid != "q0"}
    before = {qid: dict(docs) for qid, docs in partial.items()}
    qrels_before = {qid: dict(docs) for qid, docs in qrels.items()}
    scores = score_run(qrels, partial, "partial")
    assert all(scores.per_query[m]["q0"] == 0.0 for m in METRICS)
    assert partial == before
    assert qrels == qrels_before


def test_a_better_run_wins_significantly_and_an_equal_one_ties():
    rng = random.Random(7)
    qrels = {f"q{i}": {f"rel{i}": 1} for i in range(30)}
    # The baseline puts the relevant document somewhere in 2..20; the challenger first.
    baseline = {
        qid: {
            **{f"n{j}": 1.0 - j / 100 for j in range(20)},
            next(iter(docs)): 0.99 - rng.randint(1, 19) / 100,
        }
        for qid, docs in qrels.items()
    }
    better = {qid: {**ranking, next(iter(qrels[qid])): 2.0} for qid, ranking in baseline.items()}
    runs = {"cosine": baseline, "reranked": better, "same": baseline}
    scores = {name: score_run(qrels, run, name) for name, run in runs.items()}

    by_challenger = {c.challenger: c for c in compare(qrels, runs, scores, baseline="cosine")}
    won, same = by_challenger["reranked"], by_challenger["same"]
    assert (won.wins, won.ties, won.losses) == (30, 0, 0)
    assert won.p_values["fisher"]["ndcg@10"] < 0.001
    assert won.p_values["student"]["ndcg@10"] < 0.001
    assert won.delta["ndcg@10"] == pytest.approx(
        scores["reranked"].means["ndcg@10"] - scores["cosine"].means["ndcg@10"]
    )
    low, high = won.delta_ci["ndcg@10"]
    assert 0 < low <= won.delta["ndcg@10"] <= high
    assert (same.wins, same.ties, same.losses) == (0, 30, 0)
    assert same.delta["ndcg@10"] == 0.0


def test_each_challenger_gets_the_p_values_ranx_gives_it_among_all_the_runs():
    """compare() tests each challenger against the baseline alone, not every pair of runs;
    the p-values must be those of ranx.compare over all the runs at once."""
    import ranx

    rng = random.Random(11)
    qrels = {f"q{i}": {f"rel{i}": 1} for i in range(40)}

    def noisy(spread: int) -> dict[str, dict[str, float]]:
        return {
            qid: {
                **{f"n{j}": 1.0 - j / 100 for j in range(20)},
                next(iter(docs)): 0.995 - rng.randint(1, spread) / 100,  # no ties
            }
            for qid, docs in qrels.items()
        }

    runs = {"hybrid": noisy(12), "a": noisy(11), "b": noisy(14), "c": noisy(4)}
    scores = {name: score_run(qrels, run, name) for name, run in runs.items()}
    mine = {c.challenger: c for c in compare(qrels, runs, scores, baseline="hybrid")}
    assert sorted(mine) == ["a", "b", "c"]
    everything = [ranx.Run(run, name=name) for name, run in runs.items()]
    for test, tolerance in (("student", 1e-9), ("fisher", 0.02)):
        report = ranx.compare(
            ranx.Qrels(qrels),
            everything,
            metrics=["ndcg@10"],
            stat_test=test,
            n_permutations=10_000,
            random_seed=0,
        ).to_dict()
        for challenger, comparison in mine.items():
            expected = report[challenger]["comparisons"]["hybrid"]["ndcg@10"]
            assert comparison.p_values[test]["ndcg@10"] == pytest.approx(expected, abs=tolerance)
    # Not every p-value at the test's floor, or the comparison above would say little.
    assert any(0.01 < c.p_values["fisher"]["ndcg@10"] < 0.99 for c in mine.values())


def test_bootstrap_interval_brackets_the_mean_and_narrows_with_more_queries():
    rng = np.random.default_rng(0)
    small, large = rng.normal(0.1, 0.3, 30), rng.normal(0.1, 0.3, 3000)
    for values in (small, large):
        low, high = bootstrap_ci(values)
        assert low < values.mean() < high
    assert np.subtract(*bootstrap_ci(large)[::-1]) < np.subtract(*bootstrap_ci(small)[::-1]) / 5
    assert bootstrap_ci(np.full(10, 0.25)) == (0.25, 0.25)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_oracle_is_the_best_reordering_of_the_top_k(k: int):
    """Against every permutation of each query's top k (the rest kept below in order)."""
    qrels, run = random_collection(seed=k, queries=8, documents=150)
    best = []
    for qid in qrels:
        ranking = sorted(run.get(qid, {}), key=lambda d: (-run[qid][d], d))
        top, rest = ranking[:k], ranking[k:]
        values = []
        for order in itertools.permutations(top):
            ordered = [*order, *rest]
            single = {qid: {d: float(len(ordered) - i) for i, d in enumerate(ordered)}}
            values.append(score_run({qid: qrels[qid]}, single, "p").means["ndcg@10"])
        best.append(max(values))
    assert oracle_ndcg(qrels, run, k) == pytest.approx(float(np.mean(best)))
    assert oracle_ndcg(qrels, run, k) >= score_run(qrels, run, "run").means["ndcg@10"] - 1e-12
