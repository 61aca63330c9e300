"""`python -m eval.bench.soak`."""

from eval.bench.soak.run import main

raise SystemExit(main())
