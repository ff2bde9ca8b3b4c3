"""Benchmark tests of the proxy's own overhead: each module measures one thing at full scale when run
(``python -m tests.perf.MODULE --help``), and ``test_perf.py`` runs each on tiny inputs in ``make test``, so they keep
working. The numbers they gave, and the command for each, are in docs/results.md."""
