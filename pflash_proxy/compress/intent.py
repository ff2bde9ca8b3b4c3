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
   file, trained on the dev phrasings only by the relevance lab's ``python -m evals.train_intent`` in a checkout
   of the repository (the trainer and its data live in ``evals/``, outside the package).
4. ``asks_every(request)``: ``p >= THRESHOLD`` (0.5; 0.4 read two more dev every-X requests and three more
   pointed ones as every-X in cross-validation). Without a weights file (or one that does not parse) it says so in
   the log once and falls back on the form rules alone (``every_intent``).
"""

from __future__ import annotations

import json
import logging
import math
import re
from functools import lru_cache
from pathlib import Path

from .forms import NAME, PARTS, STRUCTURE, asking, every_intent, plural, request_names

__all__ = ["THRESHOLD", "IntentModel", "asks_every", "features", "load", "probability"]

log = logging.getLogger(__name__)

WEIGHTS = Path(__file__).resolve().parent / "intent.json"
THRESHOLD = 0.5  # on the dev phrasings' 5-fold cross-validation: every-X 142/150, pointed 569/588 (0.4: 144, 566)

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
