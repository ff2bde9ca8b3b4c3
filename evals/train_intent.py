"""The every-X intent classifier's trainer (``pflash_proxy/compress/intent.py``, step 3): ``python -m
evals.train_intent [--l2 X] [--sweep]`` in a checkout of the repository.

Fits the classifier (full-batch Adam on the log loss with L2, the classes weighted equally) on the dev phrasings
only and writes its weights to the package's ``compress/intent.json``: ``cases/every_dev.json`` beside this file
(every-X and pointed requests; RULER QA dev questions and the code-reads bench's train-split questions as
pointed), the dev wordings of ``cases/every_x.json`` (each with a snake_case and a plain-word name) and the dev
code tasks of ``cases/code_tasks.json`` (pointed). It also prints a 5-fold cross-validated accuracy per class;
``--sweep`` prints it per L2 (how ``L2`` was chosen). The product reads the weights and never imports this.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from pflash_proxy.compress.intent import WEIGHTS, IntentModel, features, load

CASES = Path(__file__).resolve().parent / "cases"
DEV = CASES / "every_dev.json"
L2 = 0.001  # chosen by 5-fold cross-validation on the dev phrasings (`--sweep`)
EPOCHS = 400
RULE_SHRINK = 0.1
RATE = 0.05


_NAMES = ("parse_header", "retry")  # each dev wording of every_x.json with a snake_case and a plain-word name


def examples() -> list[tuple[str, int]]:
    """The dev phrasings, labelled (1: every match or the whole; 0: one thing). Held-out splits are never read."""
    data = json.loads(DEV.read_text())
    out = [(t, 1) for t in data["every"]] + [(t, 0) for t in data["pointed"]]
    out += [(t, 0) for t in data["pointed_documents"] + data["pointed_code_reads"]]
    wordings = json.loads((CASES / "every_x.json").read_text())
    for kind, label in (("every", 1), ("pointed", 0)):
        for w in wordings[kind]:
            if w["split"] == "dev":
                out += [(str(w["wording"]).format(name=n), label) for n in _NAMES]
    tasks = json.loads((CASES / "code_tasks.json").read_text())
    out += [(str(c["task"]), 0) for c in tasks["cases"] if c["split"] == "dev"]
    return out


def _fit(rows: list[set[str]], labels: np.ndarray, l2: float) -> tuple[float, dict[str, float]]:
    vocab = sorted({f for r in rows for f in r})
    index = {f: i for i, f in enumerate(vocab)}
    x = np.zeros((len(rows), len(vocab)))
    for i, r in enumerate(rows):
        x[i, [index[f] for f in r]] = 1.0
    pos = max(1.0, float(labels.sum()))
    neg = max(1.0, float(len(labels) - labels.sum()))
    sw = np.where(labels > 0, 0.5 / pos, 0.5 / neg)  # the two classes weigh the same
    w = np.zeros(len(vocab))
    # the form signals (``r:``) are shrunk a tenth as hard as the words: they carry what a new wording shares
    # with the dev ones
    shrink = np.array([l2 * (RULE_SHRINK if f.startswith("r:") else 1.0) for f in vocab])
    b = 0.0
    m = np.zeros(len(vocab) + 1)
    v = np.zeros(len(vocab) + 1)
    for t in range(1, EPOCHS + 1):  # Adam on the weighted log loss + L2
        p = 1.0 / (1.0 + np.exp(-np.clip(x @ w + b, -30, 30)))
        g = sw * (p - labels)
        grad = np.append(x.T @ g + shrink * w, g.sum())
        m = 0.9 * m + 0.1 * grad
        v = 0.999 * v + 0.001 * grad * grad
        step = RATE * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
        w -= step[:-1]
        b -= float(step[-1])
    return b, {f: round(float(v), 4) for f, v in zip(vocab, w) if abs(v) >= 0.01}  # the rest weigh next to nothing


def _crossval(rows: list[set[str]], labels: np.ndarray, l2: float, folds: int = 5) -> tuple[float, float]:
    """Accuracy on every-X and on pointed requests, each request predicted by a model that did not see it."""
    order = np.random.default_rng(0).permutation(len(rows))
    pred = np.zeros(len(rows))
    for k in range(folds):
        test = order[k::folds]
        train_idx = np.setdiff1d(order, test)
        b, w = _fit([rows[i] for i in train_idx], labels[train_idx], l2)
        model = IntentModel(b, w)
        for i in test:
            z = model.bias + sum(model.weights.get(f, 0.0) for f in rows[i])
            pred[i] = 1.0 if z >= 0 else 0.0
    every = labels > 0
    return float((pred[every] == 1).mean()), float((pred[~every] == 0).mean())


def train(out: Path = WEIGHTS, l2: float = L2) -> dict[str, object]:
    """Step 3: fit on the dev phrasings and write the weights (sorted, rounded) to ``out``."""
    ex = examples()
    rows = [features(t) for t, _ in ex]
    labels = np.array([y for _, y in ex], dtype=np.float64)
    every_cv, pointed_cv = _crossval(rows, labels, l2)
    b, w = _fit(rows, labels, l2)
    data: dict[str, object] = {
        "about": "every-X intent classifier (compress/intent.py): logistic regression weights, trained by "
                 "`python -m evals.train_intent` on the dev phrasings only",
        "l2": l2, "examples": {"every": int(labels.sum()), "pointed": int(len(labels) - labels.sum())},
        "crossval_5fold": {"every": round(every_cv, 3), "pointed": round(pointed_cv, 3)},
        "bias": round(b, 4), "weights": dict(sorted(w.items()))}
    Path(out).write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    load.cache_clear()
    return data


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if any(a not in ("--l2", "--sweep") and (i == 0 or args[i - 1] != "--l2") for i, a in enumerate(args)):
        print("usage: python -m evals.train_intent [--l2 X] [--sweep]", file=sys.stderr)
        return 2
    if "--sweep" in args:  # the cross-validated accuracy per L2 (how L2 was chosen)
        ex = examples()
        rows = [features(t) for t, _ in ex]
        labels = np.array([y for _, y in ex], dtype=np.float64)
        for l2 in (0.001, 0.003, 0.01, 0.03):
            e, p = _crossval(rows, labels, l2)
            print(f"l2 {l2:g}: every {e:.3f}, pointed {p:.3f}")
        return 0
    l2 = float(args[args.index("--l2") + 1]) if "--l2" in args else L2
    data = train(l2=l2)
    print(f"wrote {WEIGHTS}: {data['examples']}, 5-fold cross-validated accuracy {data['crossval_5fold']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
