"""The bench's defaults that its modules share with the CLI: a leaf, importing nothing of the package, so that the
benches (``quality``) read them without importing the package's ``__init__`` (which imports the benches)."""

DRAFTER_TIMEOUT_S = 1800.0  # `--drafter-timeout`'s default: a bench wants the drafter's score, not its fallback
