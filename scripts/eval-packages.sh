#!/usr/bin/env bash
# Installs the pinned third-party packages the held-out-4 code tasks read (evals/cases/code_tasks_held_out_4.json)
# into a directory of their own, outside any virtual environment: `pip install --no-deps --target`, which keeps each
# distribution's dist-info (its METADATA, for the mined sentences). Nothing is imported from there; the evals only
# read the files:  python -m evals code-tasks --split held-out-4 --site "$EVAL_SITE"
# EVAL_SITE: the directory (default ~/.cache/pflash-proxy/eval-site); PYTHON: the interpreter whose pip installs
# (default .venv/bin/python). Needs the network (PyPI); `make test` never needs it or the directory.
set -euo pipefail
cd "$(dirname "$0")/.."
EVAL_SITE="${EVAL_SITE:-$HOME/.cache/pflash-proxy/eval-site}"
PYTHON="${PYTHON:-.venv/bin/python}"
PACKAGES=(
    arrow==1.3.0 beautifulsoup4==4.12.3 click==8.1.7 docutils==0.21.2 flask==3.1.0 isort==5.13.2
    jsonschema==4.23.0 markdown==3.7 marshmallow==3.23.1 networkx==3.4.2 parso==0.8.4
    pycodestyle==2.12.1 pyflakes==3.2.0 rich==13.9.4 sqlparse==0.5.2 starlette==0.41.3 structlog==24.4.0
    tabulate==0.9.0 tenacity==9.0.0 tomlkit==0.13.2 werkzeug==3.1.3
)
mkdir -p "$EVAL_SITE"
"$PYTHON" -m pip install --disable-pip-version-check --no-deps --upgrade --target "$EVAL_SITE" "${PACKAGES[@]}"
echo "installed ${#PACKAGES[@]} packages in $EVAL_SITE"
