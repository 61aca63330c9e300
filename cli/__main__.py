"""`python -m cli`: the `ragrank` command, for benchmarks and tests that start a server."""

from cli.main import main

raise SystemExit(main())
