"""`python -m eval.bench.soak` (`make soak`): one `ragrank serve`, on the embedded store with its
in-process worker, under mixed reads and writes for a set time (30 minutes by default).

Several closed-loop clients mix `/v1/search` (reranked, first stage only, filtered),
`/v1/rerank`, `/v1/embeddings`, ingest and delete jobs over a fixed set of document ids, job
polling and `/metrics` scrapes. Every `--interval` seconds it records the server's resident
memory, threads and open file descriptors, the batching queues, the job queue, p50/p99 per
route and the status counts; it writes them as JSON and as a PNG over time.

With `--kills N` it `kill -9`s the server N times at random moments (in the first third),
restarts it on the same
folder and goes on. At the end it checks, and exits 1 when any check fails:

- no answer was a 5xx;
- every accepted job (a 202 with its id) reached `done`, and no job is in the queue that a
  client did not send (a write whose answer a kill cut off may have landed: at most one job
  each);
- the final collection equals a clean replay of the queue's jobs, in order, into a fresh
  store: the same points, payloads and vectors, so no job was lost or applied twice;
- RSS, threads and file descriptors grow by less than 5 % (threads and descriptors: or by at
  most 2) from the first to the last tenth of the longest server life after its warm-up
  (`--warmup`: 10 % of the run, at least 60 s);
- p99 in the last tenth (five samples at least) is within 1.5x of the first: of all answers
  (at least 100 in both tenths), and of each route with at least 1,000 answers in both.
"""

from __future__ import annotations

from eval.bench.soak.checks import COUNT_SLACK, growth, jobs_done, latency
from eval.bench.soak.run import main
from eval.bench.soak.traffic import Soak

__all__ = ["COUNT_SLACK", "Soak", "growth", "jobs_done", "latency", "main"]
