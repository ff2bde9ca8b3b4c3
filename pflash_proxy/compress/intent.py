"""Every-X intent: does a request ask for every match (or for the whole message), or about one thing? A logistic
regression over what the request's asking sentences say: a request for every match is recognised by what it
asks, not by a list of phrases.

1. Text: the request's asking sentences (``forms.asking``: questions, imperatives, "please ..."), identifiers
   blanked to one neutral word (``forms.NAME``), lower-cased.
2. Features (binary): its words and word pairs (``w:``, ``b:``), the first word of each sentence (``f:``), and the
   form signals of ``spread`` (``r:``): what ``every_intent`` reads in a sentence (every / whole), a name spelled,
   a count of parts of the message ("how many functions ...") against a count of anything else ("how many
   people ..."), a pronoun that points back at the sentence before ("... all of them"), a plural after a question
   word, a singular one ("which argument controls ..."), a word that points at the message itself ("here", "this
   file", "below"), "everything"/"anywhere", several of a kind ("the different ways", "more than one place").
3. Model: ``p = sigmoid(b + sum of the present features' weights)``; the weights are ``intent.json`` beside this
   file, trained by ``python -m pflash_proxy.compress.intent train`` (full-batch Adam on the log loss with L2,
   the classes weighted equally) on the dev phrasings only: ``every_dev.json`` (every-X and pointed
   requests; RULER QA dev questions and the code-reads bench's train-split questions as pointed), the dev wordings of ``bench/cases/every_x.json`` (each with a
   snake_case and a plain-word name) and the dev code tasks of ``bench/cases/code_tasks.json`` (pointed). The
   command also prints a 5-fold cross-validated accuracy per class.
4. ``asks_every(request)``: ``p >= THRESHOLD`` (0.5; 0.4 read two more dev every-X requests and three more
   pointed ones as every-X in cross-validation). Without a weights file (or one that does not parse) it says so in
   the log once and falls back on the form rules alone (``every_intent``).
"""

from __future__ import annotations

import json
import logging
import math
import re
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np

from .forms import NAME, PARTS, STRUCTURE, asking, every_intent, plural, request_names

__all__ = ["THRESHOLD", "IntentModel", "asks_every", "features", "load", "probability", "train"]

log = logging.getLogger(__name__)

WEIGHTS = Path(__file__).resolve().parent / "intent.json"
DEV = Path(__file__).resolve().parent / "every_dev.json"
THRESHOLD = 0.5  # on the dev phrasings' 5-fold cross-validation: every-X 142/150, pointed 569/588 (0.4: 144, 566)
L2 = 0.001  # chosen by 5-fold cross-validation on the dev phrasings (`train --sweep`)
EPOCHS = 400
RULE_SHRINK = 0.1
RATE = 0.05

_AUX_WORDS = frozenset("is are was were does do did has have had can could should would will of the a an".split())
_WORD = re.compile(r"[a-z][a-z'-]*|\d+")
# the counted noun of "how many" is a part of the message ("functions", "entries", "times" X is called) or not
_COUNTED = re.compile(r"\bhow\s+many\s+(?:[a-z'-]+\s+){0,2}?([a-z'-]+s)\b|\bnumber\s+of\s+(?:[a-z'-]+\s+)?([a-z'-]+s)\b"
                      r"|^\W*(?:please\s+)?count\b")
_ANAPHOR = re.compile(r"\b(?:all|each|every\s+one|any|both)\s+of\s+(?:them|those|these)\b|\bthem\s+all\b"
                      r"|\b(?:each|every)\s+one\b|\ball\s+(?:those|these)\b|\bthe\s+(?:full|whole|complete)\s+list\b")
_HERE = re.compile(r"\b(?:here|below|above|in\s+(?:this|the)\s+(?:file|module|code|source|document|log|text|page|"
                   r"script)|this\s+(?:file|module|code|document|log|page|script|source))\b")
_ALL_PRONOUN = re.compile(r"\b(?:everything|everywhere|everyone|everybody|anything|anywhere)\b")
_MANY = re.compile(r"\b(?:different|various|several|multiple|other|more\s+than\s+one)\s+(?:[a-z'-]+\s+)?"
                   r"(?:ways|places|kinds|types|spots|callers|functions|methods|paths|modules|files|cases|parts)\b"
                   r"|\bmore\s+than\s+(?:one|once)\b")
_WH_ONE = re.compile(r"\b(?:which|what)\s+(?:one\s+|single\s+)?([a-z'-]{3,})\s+(?:is|was|does|did|has|can|should|"
                     r"would|will|[a-z'-]+s)\b")
_PLURAL_WH = re.compile(r"\b(?:which|what)\s+(?:of\s+(?:the|these|those|your|our)\s+)?(?:[a-z'-]+\s+)?([a-z'-]{4,}s)\b")


def _sentences(request: str) -> list[str]:
    return [" ".join(s.lower().split()) for s in asking(request)]


def features(request: str) -> set[str]:
    """Step 2: the request's features (the empty set when no sentence of it asks anything)."""
    out: set[str] = set()
    for s in _sentences(request):
        words = [w if w != NAME else "NAME" for w in _WORD.findall(s)]
        out.update(f"w:{w}" for w in words)
        out.update(f"b:{a} {b}" for a, b in zip(words, words[1:]))
        if words:
            out.add(f"f:{words[0]}")
        intent = every_intent(s)
        if intent is not None:
            out.add(f"r:{intent}")
        for m in _COUNTED.finditer(s):
            noun = next((g for g in m.groups() if g), None)
            part = noun is None or noun == "times" or bool(PARTS.match(noun)) or bool(STRUCTURE.fullmatch(noun))
            out.add("r:count-part" if part or _HERE.search(s) else "r:count-other")
        if _ANAPHOR.search(s):
            out.add("r:anaphor")
        if _HERE.search(s):
            out.add("r:here")
        if _ALL_PRONOUN.search(s):
            out.add("r:all-pronoun")
        if _MANY.search(s):
            out.add("r:many")
        one = _WH_ONE.search(s)
        if one is not None and not plural(one.group(1)) and one.group(1) not in _AUX_WORDS:
            out.add("r:which-one")  # "which argument controls ...", "what file is ...": one thing
        for m in _PLURAL_WH.finditer(s):
            if plural(m.group(1)):
                out.add("r:plural-wh-part" if PARTS.match(m.group(1)) or STRUCTURE.fullmatch(m.group(1))
                        else "r:plural-wh")
    if out and request_names(request):
        out.add("r:name")
    return out


class IntentModel:
    """Step 3: a bias and a weight per feature (features it does not know weigh nothing)."""

    def __init__(self, bias: float, weights: dict[str, float]) -> None:
        self.bias = bias
        self.weights = weights

    def probability(self, request: str) -> float:
        f = features(request)
        if not f:
            return 0.0  # asks nothing
        z = self.bias + sum(self.weights.get(x, 0.0) for x in f)
        return 1.0 / (1.0 + math.exp(-max(-30.0, min(30.0, z))))


@lru_cache(maxsize=1)
def load(path: Path = WEIGHTS) -> IntentModel | None:
    """The shipped weights, or None (logged once) when the file is missing or does not parse."""
    try:
        data = json.loads(Path(path).read_text())
        return IntentModel(float(data["bias"]), {str(k): float(v) for k, v in data["weights"].items()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("every-X intent: no classifier weights (%s: %s); the form rules alone decide", path, exc)
        return None


def probability(request: str) -> float | None:
    """Step 3's probability that ``request`` asks for every match, or None without weights."""
    model = load()
    return None if model is None else model.probability(request)


def asks_every(request: str) -> bool:
    """Step 4: the classifier's decision (the form rules' without weights)."""
    p = probability(request)
    if p is None:
        return any(every_intent(s) is not None for s in asking(request))
    return p >= THRESHOLD


# -- training (step 3) ------------------------------------------------------------------------------------------

_NAMES = ("parse_header", "retry")  # each dev wording of every_x.json with a snake_case and a plain-word name


def examples() -> list[tuple[str, int]]:
    """The dev phrasings, labelled (1: every match or the whole; 0: one thing). Held-out splits are never read."""
    data = json.loads(DEV.read_text())
    out = [(t, 1) for t in data["every"]] + [(t, 0) for t in data["pointed"]]
    out += [(t, 0) for t in data["pointed_documents"] + data["pointed_code_reads"]]
    bench = Path(__file__).resolve().parent.parent / "bench" / "cases"
    wordings = json.loads((bench / "every_x.json").read_text())
    for kind, label in (("every", 1), ("pointed", 0)):
        for w in wordings[kind]:
            if w["split"] == "dev":
                out += [(str(w["wording"]).format(name=n), label) for n in _NAMES]
    tasks = json.loads((bench / "code_tasks.json").read_text())
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
                 "`python -m pflash_proxy.compress.intent train` on the dev phrasings only",
        "l2": l2, "examples": {"every": int(labels.sum()), "pointed": int(len(labels) - labels.sum())},
        "crossval_5fold": {"every": round(every_cv, 3), "pointed": round(pointed_cv, 3)},
        "bias": round(b, 4), "weights": dict(sorted(w.items()))}
    Path(out).write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    load.cache_clear()
    return data


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] != "train":
        print("usage: python -m pflash_proxy.compress.intent train [--l2 X] [--sweep]", file=sys.stderr)
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
