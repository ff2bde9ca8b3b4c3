"""Flat-relevance gate: is the relevance spread over more units than the budget keeps, for a request that asks
for every match?

Definition (over the *unpinned* units only: the pinned tail is kept whatever its score, so it says nothing about
how the rest is ranked):

    p_i   = s_i / sum(s)                        relevance share of unpinned unit i (s_i >= 0)
    N_eff = 1 / sum(p_i^2) = sum(s)^2 / sum(s^2)  effective number of relevant units
                                                  (participation ratio; N_eff = n for
                                                  equal scores, ~1 for a single needle)
    spread = (N_eff - k) / k                      k = unpinned units the budget keeps (at least 1): the
                                                  effectively relevant units beyond those the budget keeps,
                                                  per kept unit (> 0: more than it keeps)

The seed divided by n, the unpinned units, instead of k. Measured on the calibration sets
(the flat-gate sets, train split; ``docs/results.md``), one threshold per kept unit holds across prompt lengths and document
kinds where one per unit does not: the budget keeps a different share of the units of prose and code and of a
short and a long message, and ``/ n`` shrinks the same excess by that share.

Why the participation ratio rather than Shannon perplexity or "units holding 80% of the mass": both of those grow
with the long tail of tiny lexical matches that any long message has; N_eff is dominated by the large shares, so
a handful of strong units keeps it small while "every record mentions X" (all shares ~1/n) drives it to ~n.

When it applies (``flat_gate``):
1. Zero total relevance over the unpinned units is flat (spread = 1): nothing says what to keep.
2. Otherwise only a request that asks for every match can be flat (``asks_for_every``: a classifier trained on
   dev phrasings, ``intent.py``, whose features are the request's words and the form signals of ``every_intent``: the thing asked for quantified ("describe all
   handlers", "what does each handler do"), plural after a question word ("which functions call retry"),
   counted ("how many", not "how many times"), enumerated ("list ...", "name the classes ..."), or its uses
   ("where is retry used", "who calls X"); not a quantifier in a condition ("... when every coefficient is
   small") or in the predicate of a question about one thing ("which function returns all items"), nor a word
   of an identifier: "In Summary.time, ..." names a method). A request about the whole message ("give a summary
   of what this module does", "what is this file for", ``asks_for_whole``) is flat whatever the scores: every
   unit is relevant to it; so is, in source code, a request for every match that spells no name ("each place
   that writes to disk": what matches is found by reading the code, not by its words).
   A pointed question ("which function interleaves the address infos?") over a cold document is compressed
   whatever the spread: measured on generated documents (``docs/results.md``, flat gate), the lexical spread of a
   pointed question and of a "list every X" over the same documents overlap, so a spread threshold alone
   either serves most pointed questions whole or compresses most aggregation requests.
3. What is spread is what the request asks every match *of*: the sentences of the request that hold the
   every-words (``every_clause``: "List all the steps it takes." of "Which function parses the header? List all
   the steps it takes."), scored on their own by BM25 whatever the serving scorer (``pipeline.gate_scores``). A
   request's other sentences point at one thing; an every-clause whose own words have no relevance at all ("all
   the steps *it* takes") asks for every part of that thing, which the units it points at hold, so it is not
   flat. Measured on the calibration sets, scoring the whole request instead mixes the pointed sentence's many
   words into the measure, and a pointed question with "list all the steps" reads as spread as a "list every
   X"; a drafter's relevance of such a clause is spread over the message whether or not its words occur there.
   The scorer's own part is its kept units ``k`` and its threshold curve.
4. Such a request is flat when ``spread > threshold``, the threshold read from the scorer's curve at the prompt's
   length (``SpreadCurve``: ``tokens:threshold`` points, linear between them, flat beyond; the defaults live
   with each scorer's registry entry, ``stages/scorers.py``), or one number for every length
   (``PFLASH_FALLBACK_SPREAD``; 0.11, the seed's number, for a scorer the registry does not know).
``Spread.reason`` is the decision in one sentence, with the numbers it used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from .request import asks

__all__ = ["Spread", "SpreadCurve", "asks_for_every", "asks_for_whole", "every_clause", "every_intent", "flat_gate",
           "kept_mass", "relevance_spread", "request_names"]

# Step 2: identifiers are names, not every-words ("In Summary.time, ..." asks about one method, "`each`" names a
# keyword): code spans, dotted / qualified names and paths, snake_case, CamelCase and camelCase words, calls, and
# a capitalised "Summary"/"Overview" inside a sentence (a class, as in "What does the Summary class do?")
_IDENTIFIER = re.compile(
    r"`[^`\n]*`"  # a code span, whatever it holds
    r"|(?![A-Z]{1,4}/[A-Z]{1,4}\b)[\w$]+(?:(?:\.|::|->|#|/)[\w$]+)+"  # Class.method, pkg/mod.py, Class::method
    # (not an abbreviation such as I/O or TCP/IP)
    r"|\b\w*_\w*"  # snake_case, __dunder__
    r"|\b[A-Z][a-z0-9]+[A-Z]\w*|\b[a-z]+[A-Z]\w*"  # CamelCase, camelCase
    r"|\b\w+(?=\()"  # a call: summary(...)
    r"|(?<=[^\s.?!:;\"'(] )(?<!\b[Aa] )(?<!\b[Aa]n )(?<!\b[Tt]he )(?:Summary|Overview)\b(?!\s+of\b)"
    r"|(?<=\b[Tt]he )(?:Summary|Overview)\b(?=\s+(?:class|object|type|method|function|module|widget)\b)")
# ... capitalised inside a sentence it is a class name, not "a Summary of", "the Summary of"


NAME = "qqname"  # what an identifier is blanked to: one neutral word, never an English one


def _prose(text: str) -> str:
    """The request with its identifiers blanked (each to one neutral word, so word distances stay)."""
    return _IDENTIFIER.sub(f" {NAME} ", text)


MAX_THRESHOLD = 100.0
_SENTENCE = re.compile(r"(?<=[.?!])\s+|\n+")


def request_names(request: str) -> list[str]:
    """The identifiers a request spells (``_IDENTIFIER``: code spans, dotted names, snake_case, CamelCase,
    calls), without backticks: what "every caller of X" asks every match of."""
    out = []
    for m in _IDENTIFIER.finditer(request or ""):
        name = m.group().strip("`").strip()
        if name and name not in ("Summary", "Overview") and any(c.isalpha() for c in name) \
                and "/" not in name and not re.search(r"\.(?:py|js|ts|go|rs|java|c|h|cc|cpp|rb|md|txt|json|toml|"
                                                       r"ya?ml|cfg|ini|sh|html?|css|xml|log)$", name):
            out.append(name)  # a file's name names the whole file, not a match in it
    return out


def asks_for_every(request: str) -> bool:
    """Step 2: the request asks for every match (or for the whole), not for one thing: the classifier of
    ``intent.py`` over what its asking sentences say (``every_intent``'s form signals among its features). Words
    that are part of an identifier (``_IDENTIFIER``) do not count, nor sentences that ask nothing (a bug
    report's "Removing every value stored under a key leaves ...": ``_asking``)."""
    from .intent import asks_every

    return asks_every(request or "")


# a sentence whose every-words point back at the one before it ("... ? Quote each of them."): the matches are
# what that sentence describes
_BACK = re.compile(r"\b(?:all|each|every\s+one|any|both)\s+of\s+(?:them|those|these)\b|\bthem\s+all\b"
                   r"|\b(?:each|every)\s+one\b|\ball\s+(?:those|these)\b", re.IGNORECASE)


_ONE = re.compile(r"\b(?:it|its|it's)\b", re.IGNORECASE)


def every_clause(request: str) -> str:
    """Step 3: the request's sentences that ask for every match, in order, each with the sentence before it when
    its every-words point back at that one ("all of them", "each one"); the whole request when none does, or
    when that is all of it."""
    parts = [p for p in _SENTENCE.split((request or "").strip()) if p.strip()]
    every: list[int] = []
    for i, p in enumerate(parts):
        if any(every_intent(q) is not None for q in _asking(p)):
            if i > 0 and _BACK.search(_prose(p)) and i - 1 not in every:
                every.append(i - 1)
            every.append(i)
    return " ".join(parts[i] for i in every) if every and len(every) < len(parts) else request


def asks_for_whole(request: str) -> bool:
    """Step 2: the request asks about the whole message (a summary or description of this module, document,
    page, log ...), so every part of it is relevant whatever the scores: it asks for every match
    (``asks_for_every``) and one of its sentences asks for the whole (``every_intent`` == "whole")."""
    return any(every_intent(p) == "whole" for p in _asking(request)) and asks_for_every(request)


# Step 2: what a request asks for, by its form rather than by a list of phrases. A sentence asks for every match
# when the thing it asks for is quantified ("all handlers", "each handler", "every record"), plural after a
# question word ("which functions call ...", "what files ..."), counted ("how many", "the number of"),
# enumerated ("list ...", "enumerate ..."), or its uses/occurrences ("where is X used", "who calls X",
# "the callers of X"), or it asks to be exhaustive ("be exhaustive", "the complete list"); it asks for the
# whole when it asks for a summary, an overview, a description or a review of the message itself ("this module",
# "the document", "this entire file"). A quantifier in a subordinate clause ("... when every
# coefficient is small") or in the predicate of a question about one thing ("which function returns all
# items") does not make a request ask for every match.
_SUBORDINATE = frozenset("when whenever if unless while until once after before because since though although "
                         "whether without".split())
_QUANT = re.compile(r"\b(?:every|each|all)\b(?!\s+(?:right|at\s+once|of\s+a\s+sudden|along|the\s+same|over\b))")
_NOT_QUANT = re.compile(r"\b(?:at|above|not|is|that's|thats|it's)\s+all\b|\bafter\s+all\b(?=\s*[,.;!?]|\s*$)"
                        r"|\beach\s+other\b|\ball\s+in\s+all\b")
# an instruction before the question ("Read the file and answer: which ...") is not what is asked
_WH = re.compile(r"^(?:[^:?!]{0,80}:\s+)?(?:\W*(?:and|so|but|also|then|now|ok|okay|please|tell\s+me|can\s+you\s+tell\s+me)\W+)*"
                 r"(which|what)\s+(?!of\b)((?:[a-z'-]+\s*){1,4})")
_DET = frozenset("the a an this that these those my our its his her their your all every each some any".split())
_SHOW = re.compile(r"^(?:\W*(?:and|so|then|now|please|also|could\s+you|can\s+you|would\s+you)\W+)*"
                   r"(?:name|show|find|give|point\s+out|collect|extract|quote|identify|gather|highlight|print)"
                   r"(?:\s+me)?\s+(?:(?:the|all|every|each|any)\s+)?([a-z'-]+)(?:\s+([a-z'-]+))?\b")
# the kinds of place a match sits in: "which functions / files / lines ..." asks for every one of them; "which
# values / responses / errors ..." most often for what one definition accepts or does
_PARTS = re.compile(r"(?:functions|methods|classes|files|modules|places|lines|callers|tests|handlers|definitions|"
                    r"records|entries|sections|paragraphs|rows|messages|documents|emails|components|parts|spots|"
                    r"locations|usages|occurrences|instances|callbacks|routes|endpoints|subclasses|variables|"
                    r"constants|packages|scripts|pages|chapters|items|sites|modules|options|flags|events)$")
_HOW = re.compile(r"\b(?:how|why|where|when)\s+(?:do|does|did|is|are|was|were|can|could|should|would|will|to|"
                  r"come)\b|^(?:\W*(?:and|so|but|also|then|now|ok|okay|please)\W+)*(?:how|why)\b(?!\s+many\b)"
                  r"|\bwhat(?:'s|\s+is)\s+the\s+(?:\w+\s+)?way\s+to\b")
_NOT_VERB = _SUBORDINATE | frozenset("to in on at for with about of from here there next now first then by into "
                                     "under over through".split())
_AUX = frozenset("does do did is are was were has have had can could should would will shall may might must "
                 "this that these those its his her their my our your kind sort type".split())
_SINGULAR_S = ("ss", "us", "is", "ous", "'s", "ics", "ws", "ys")
_COUNT = re.compile(r"\bhow\s+many\b(?!\s+times)|^\W*(?:please\s+)?(?:count|tally)\b|\bnumber\s+of\b(?!\s+times)")
_ENUM = re.compile(r"^(?:\W*(?:and|so|then|now|please|also|could\s+you|can\s+you|would\s+you|i\s+need\s+you\s+to|"
                   r"give\s+me|show\s+me)\W+)*(?:list|enumerate|itemi[sz]e|tabulate|catalog(?:ue)?)\b"
                   r"|\b(?:full|complete|entire)\s+list\s+of\b")
_USES = re.compile(r"\bwhere\b(?:\s+(?:else|all|exactly))?(?:\s+[\w'-]+){0,6}?\s+(?:used|called|referenced|invoked|"
                   r"imported|mentioned|instantiated)\b"
                   r"|\bwhere\s+(?:else|all)\b"
                   r"|\b(?:who|what)\s+(?:else\s+)?(?:calls|uses|references|imports|invokes|reads|writes|modifies|"
                   r"mutates|raises|triggers|depends\s+on|relies\s+on|touches|subclasses|overrides|extends)\b"
                   r"|\b(?:callers|usages|uses|references|occurrences|instances|call\s+sites|mentions|"
                   r"consumers|subclasses)\s+(?:of|to)\b"
                   r"|\beverywhere\b|\banywhere\b(?=[^?]*\?)")
_SUMMARY = re.compile(r"\b(?:summar(?:y|ies|i[sz]e|i[sz]ing)|overview|gist|tl;?dr|recap|synopsis|rundown|"
                      r"high[- ]level\s+(?:view|description|picture|explanation))\b")
_OBJECT = (r"(?:this|the|whole|entire|above|following|attached|pasted|given)\s+(?:whole\s+|entire\s+)?"
           r"(?:module|file|document|doc|page|code|codebase|article|log|logs|text|paper|thread|script|library|package|"
           r"repo|repository|chapter|report|output|transcript|email|conversation|source|readme|manual|program|diff|"
           r"patch|essay|story|book|passage)\b")
_WHOLE_OBJECT = re.compile(r"\b" + _OBJECT)
_DESCRIBE = re.compile(r"^(?:\W*(?:please|can\s+you|could\s+you)\W+)*(?:describe|explain|walk\s+me\s+through|"
                       r"go\s+through|outline|sum\s+up|review|audit|critique|proofread|scan|inspect|check|"
                       r"read\s+through|look\s+over|go\s+over)\b")
_EXHAUSTIVE = re.compile(r"\b(?:exhaustive(?:ly)?|comprehensive(?:ly)?|(?:complete|full|entire)\s+list|every\s+single|"
                         r"without\s+(?:missing|skipping)|(?:don'?t|do\s+not)\s+(?:miss|skip|leave\s+out)"
                         r"|leave\s+nothing\s+out|not\s+just\s+(?:one|the\s+first))\b")
_WHAT_WHOLE = re.compile(r"\bwhat\s+(?:does|do|is|are)\s+" + _OBJECT + r"\s+(?:do|does|for|about)\b")


_ABSTRACT = frozenset("details steps instructions thoughts ideas pointers hints tips specifics basics pros cons "
                      "internals semantics mechanics contents".split())


def _plural(word: str) -> bool:
    """A plural noun by its form (``functions``, ``handlers``; not ``class``, ``status``, ``its``)."""
    w = word.lower()
    return len(w) > 3 and w.endswith("s") and not w.endswith(_SINGULAR_S) and w not in _AUX and w not in _ABSTRACT


def every_intent(sentence: str) -> str | None:
    """Step 2: what one sentence of a request (identifiers already blanked) asks for: ``"whole"`` (a summary or
    description of the message itself, or every one of its parts: "what does each function here do", "list the
    constants"), ``"every"`` (all matches: quantified, plural, counted, enumerated, or its uses), or None (one
    thing)."""
    got = _every_intent(" ".join(sentence.lower().split()))
    low = sentence.lower()
    parts = [m for m in _STRUCTURE.finditer(low)
             if not re.search(r"\b(?:its|their|his|her)\s+(?:[a-z'-]+\s+)?$", low[:m.start()])]  # not "its fields"
    if got == "every" and NAME not in low and (parts or (_WHOLE_OBJECT.search(low) and not _USES.search(low))):
        return "whole"  # every function, class, section ... of the message, or every X of "this module"
    return got


# the kinds of part a message is made of: a request for every one of them asks for the whole message
_STRUCTURE = re.compile(r"\b(?:functions?|methods?|class(?:es)?|definitions?|constants?|variables?|sections?|"
                        r"paragraphs?|chapters?|entry\s+points?|todos?|modules?-level|globals?|endpoints?|"
                        r"routes?|headings?|handlers?|callbacks?|helpers?|imports?)\b")




def _every_intent(t: str) -> str | None:
    if not t:
        return None
    if _SUMMARY.search(t) or _WHAT_WHOLE.search(t) or (_DESCRIBE.search(t) and _WHOLE_OBJECT.search(t)
                                                        and not _QUANT.search(t)):
        m = _SUMMARY.search(t)
        rest = t[m.end():] if m else ""
        bare = not re.search(r"[^\W\d_]", re.sub(r"\b(?:please|me|us|quick|short|brief|it|of it|pls)\b", "", rest))
        return "whole" if (_WHOLE_OBJECT.search(t) or _WHAT_WHOLE.search(t) or bare) else "every"
    if _USES.search(t) or _EXHAUSTIVE.search(t):
        return "every"
    wh = _WH.search(t)
    if wh is not None:  # the noun after "which"/"what" (or the second word, before an auxiliary): what is asked for
        words = wh.group(2).split()
        w = [x.strip(",;:") for x in words] + ["", "", ""]
        if w[0] in ("are", "were") and _plural(w[2] if w[1] in _DET else w[1]):
            return "every"  # "what are the endpoints"
        named_subject = w[1] in _AUX and NAME in t[wh.end(1):]
        if w[0] not in _AUX and _plural(w[0]) and _PARTS.match(w[0]) and w[1] not in _NOT_VERB and w[1] not in _DET \
                and not named_subject:
            return "every"  # "which functions call", "what files import" (not "which verbs does X.parse accept")
        if w[0] not in _AUX and _plural(w[1]) and _PARTS.match(w[1]) and (w[2] in _AUX or not w[2]):
            return "every"  # "what test files does it import"
        if words and w[0] not in _AUX:
            return None  # "which function returns all items / the number of loops": about one thing
    if _COUNT.search(t) or _ENUM.search(t):
        return "every"
    show = _SHOW.search(t)
    if show is not None and (_plural(show.group(1)) or (show.group(1) not in _DET and _plural(show.group(2) or ""))):
        return "every"  # "name the classes defined here", "show me the functions that ..."
    if _HOW.search(t):
        return None  # "how is each request authenticated", "where does it build each level": one thing, for each
    blanked = _NOT_QUANT.sub(" ", t)
    for m in _QUANT.finditer(blanked):
        before = blanked[: m.start()].split()
        if any(w.strip(",;:") in _SUBORDINATE for w in before):
            continue  # "... when every coefficient is small": a condition, not what is asked for
        return "every"
    return None


_REQUESTING = re.compile(r"\b(?:please|pls|tell\s+me|show\s+me|give\s+me|can\s+you|could\s+you|would\s+you|"
                         r"i\s+need\s+(?:you\s+to|a|the|all|every))\b|" + _SUMMARY.pattern + "|" + _EXHAUSTIVE.pattern)


def _asking(request: str) -> list[str]:
    """Step 2: the request's sentences (identifiers blanked) that ask something: a question, an imperative, a
    "please", or a summary asked for in a few words ("tl;dr of the file"); not a statement of what happens."""
    return [p for p in _sentences(_prose(request or "")) if asks(p) or _REQUESTING.search(p.lower())]


def _sentences(text: str) -> list[str]:
    return [p for p in _SENTENCE.split(text.strip()) if p.strip()]


@dataclass(frozen=True)
class SpreadCurve:
    """Step 4: the flat threshold as a function of the prompt's tokens."""

    points: tuple[tuple[int, float], ...]

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError("spread curve: needs at least one point")
        prev = None
        for n, t in self.points:
            if n <= 0 or not -1.0 <= t <= MAX_THRESHOLD:  # spread > -1: negative when N_eff < k
                raise ValueError(f"spread curve: point {n}:{t} needs tokens > 0 and a threshold in "
                                 f"[-1, {MAX_THRESHOLD:g}]")
            if prev is not None and n <= prev:
                raise ValueError(f"spread curve: points must ascend in tokens ({prev} then {n})")
            prev = n

    @classmethod
    def parse(cls, spec: str | float) -> "SpreadCurve":
        """``"4096:0.08 32768:0.02"``, or one number for every length."""
        if isinstance(spec, (int, float)):
            return cls(((1, float(spec)),))
        pts = []
        for item in spec.replace(",", " ").split():
            tok, sep, thr = item.partition(":")
            try:
                pts.append((int(tok), float(thr)) if sep else (1, float(tok)))
            except ValueError:
                raise ValueError(f"spread curve: point {item!r} is not tokens:threshold") from None
        return cls(tuple(pts))

    def at(self, tokens: int) -> float:
        return float(np.interp(tokens, [p[0] for p in self.points], [p[1] for p in self.points]))

    def __str__(self) -> str:
        if len(self.points) == 1:
            return f"{self.points[0][1]:g}"
        return " ".join(f"{n}:{t:g}" for n, t in self.points)


@dataclass(frozen=True)
class Spread:
    spread: float
    effective_units: float
    kept_units: int  # unpinned units the budget keeps
    n_units: int  # unpinned units
    flat: bool
    threshold: float = 0.11
    applies: bool = True  # step 2: the request asks for every match (or the relevance is zero)
    clause: str | None = None  # step 3: the every-clause scored on its own, when it is not the whole request
    whole: bool = False  # step 2: the request asks about the whole message (a summary, a description of it)
    matches: tuple[int, int, int] | None = None  # pipeline step 5b: (matching units, their tokens, budget) too many

    @property
    def reason(self) -> str:
        """The decision as one sentence, with the numbers it used."""
        if self.matches is not None:
            n, need, budget = self.matches
            return (f"relevance too flat for a request that asks for every match: its {n} matching units and the "
                    f"pinned ones hold {need} tokens, more than the {budget}-token budget")
        if self.whole:
            return (f"relevance too flat for a request about the whole message (a summary, a description or every "
                    f"part of it): all {self.n_units} of the {self.n_units} unpinned units are relevant, against "
                    f"the {self.kept_units} the budget keeps (spread per kept unit {self.spread:.3f} > "
                    f"{self.threshold:.3f})")
        if self.kept_units == 0 and self.spread >= 1.0 and self.effective_units == self.n_units:
            return f"relevance too flat: none of the {self.n_units} unpinned units has any relevance to the request"
        verdict = (f"against the {self.kept_units} the budget keeps (spread per kept unit {self.spread:.3f} "
                   f"{'>' if self.flat else '<='} {self.threshold:.3f})")
        what = "for a request that asks for every match" if self.applies else "(a pointed request: not gated)"
        if self.applies and self.clause is not None:
            what += f" ({_quote(self.clause)})"
        return (f"relevance {'too flat' if self.flat else 'spread'} {what}: about {self.effective_units:.1f} of the "
                f"{self.n_units} unpinned units are relevant, {verdict}")


def _quote(text: str, most: int = 60) -> str:
    t = " ".join(text.split())
    return f"'{t if len(t) <= most else t[:most - 1] + '…'}'"


def relevance_spread(scores: np.ndarray, kept_units: int, fallback_spread: float = 0.11) -> Spread:
    """The spread of the unpinned units' ``scores`` against a budget keeping ``kept_units`` of them."""
    s = np.asarray(scores, dtype=np.float64)
    n = len(s)
    total = float(s.sum())
    if n == 0 or total <= 0.0:
        return Spread(1.0, float(n), 0, n, True, fallback_spread)
    n_eff = total * total / float(np.dot(s, s))
    spread = (n_eff - kept_units) / max(1, kept_units)
    return Spread(spread, n_eff, kept_units, n, spread > fallback_spread, fallback_spread)


def flat_gate(scores: np.ndarray, kept_units: int, threshold: float, request: str,
              clause_scores: np.ndarray | None = None, code: bool = False) -> Spread:
    """Steps 1-4: the spread, flat only where the gate applies. ``scores``: the unpinned units' relevance (step 1
    reads it); ``clause_scores``: theirs for ``every_clause(request)`` (step 3; the pipeline's are BM25's), the
    measured ones when given, else ``scores``. ``code``: the message is source code, where a request for every
    match whose every-clause names something here (its BM25 is not all zero) but spells no name nor points at one
    thing ("it") (``request_names``: "every place that writes to disk", "each function without
    tests") asks about the whole message: its matches are found by reading the code, not by its words."""
    sp = relevance_spread(scores, kept_units, threshold)
    if float(np.asarray(scores, dtype=np.float64).sum()) <= 0.0:
        return sp  # step 1
    if asks_for_whole(request):
        return Spread(max(sp.spread, (sp.n_units - sp.kept_units) / max(1, sp.kept_units)), float(sp.n_units),
                      sp.kept_units, sp.n_units, True, threshold, True, None, True)
    applies = asks_for_every(request)
    if not applies or clause_scores is None:
        return Spread(sp.spread, sp.effective_units, sp.kept_units, sp.n_units, sp.flat and applies, threshold,
                      applies)
    clause = every_clause(request)
    shown = clause if clause != request else None
    cs = relevance_spread(clause_scores, kept_units, threshold)
    if float(np.asarray(clause_scores, dtype=np.float64).sum()) <= 0.0:  # "all the steps it takes": its own
        # words name nothing here, so it asks for every part of what the other sentences point at
        return Spread(-1.0, 0.0, cs.kept_units, cs.n_units, False, threshold, True, shown)
    if code and not request_names(request) and not _ONE.search(clause):  # every match of what the code does,
        # not of a name (nor every part of the one thing "it" points at: "list all the steps it takes"): the whole
        return Spread(max(sp.spread, (sp.n_units - sp.kept_units) / max(1, sp.kept_units)), float(sp.n_units),
                      sp.kept_units, sp.n_units, True, threshold, True, shown, True)
    return Spread(cs.spread, cs.effective_units, cs.kept_units, cs.n_units, cs.flat, threshold, True, shown)


def kept_mass(scores: np.ndarray, kept: np.ndarray, free: np.ndarray) -> float:
    """The share of the unpinned units' relevance that the kept unpinned units hold (0 when there is none)."""
    s = np.asarray(scores, dtype=np.float64)
    total = float(s[free].sum())
    return float(s[kept & free].sum()) / total if total > 0 else 0.0
