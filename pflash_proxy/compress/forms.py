"""What a request asks for, by the form of its sentences: the identifiers it spells (``request_names``), its
sentences that ask something (``asking``: questions, imperatives, "please ..."), and what one such sentence asks
for (``every_intent``: every match, the whole message, or one thing). The every-X classifier (``intent.py``) reads
these as features and the flat gate (``spread.py``) decides from the classifier; both import this module, neither
imports the other's helpers."""

from __future__ import annotations

import re

from .request import asks

__all__ = ["NAME", "PARTS", "STRUCTURE", "asking", "every_intent", "plural", "prose", "request_names", "sentences"]

# Identifiers are names, not every-words ("In Summary.time, ..." asks about one method, "`each`" names a
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


def prose(text: str) -> str:
    """The request with its identifiers blanked (each to one neutral word, so word distances stay)."""
    return _IDENTIFIER.sub(f" {NAME} ", text)


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


# What a request asks for, by its form rather than by a list of phrases. A sentence asks for every match
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
PARTS = re.compile(r"(?:functions|methods|classes|files|modules|places|lines|callers|tests|handlers|definitions|"
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


def plural(word: str) -> bool:
    """A plural noun by its form (``functions``, ``handlers``; not ``class``, ``status``, ``its``)."""
    w = word.lower()
    return len(w) > 3 and w.endswith("s") and not w.endswith(_SINGULAR_S) and w not in _AUX and w not in _ABSTRACT


def every_intent(sentence: str) -> str | None:
    """What one sentence of a request (identifiers already blanked) asks for: ``"whole"`` (a summary or
    description of the message itself, or every one of its parts: "what does each function here do", "list the
    constants"), ``"every"`` (all matches: quantified, plural, counted, enumerated, or its uses), or None (one
    thing)."""
    got = _every_intent(" ".join(sentence.lower().split()))
    low = sentence.lower()
    parts = [m for m in STRUCTURE.finditer(low)
             if not re.search(r"\b(?:its|their|his|her)\s+(?:[a-z'-]+\s+)?$", low[:m.start()])]  # not "its fields"
    if got == "every" and NAME not in low and (parts or (_WHOLE_OBJECT.search(low) and not _USES.search(low))):
        return "whole"  # every function, class, section ... of the message, or every X of "this module"
    return got


# the kinds of part a message is made of: a request for every one of them asks for the whole message
STRUCTURE = re.compile(r"\b(?:functions?|methods?|class(?:es)?|definitions?|constants?|variables?|sections?|"
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
        if w[0] in ("are", "were") and plural(w[2] if w[1] in _DET else w[1]):
            return "every"  # "what are the endpoints"
        named_subject = w[1] in _AUX and NAME in t[wh.end(1):]
        if w[0] not in _AUX and plural(w[0]) and PARTS.match(w[0]) and w[1] not in _NOT_VERB and w[1] not in _DET \
                and not named_subject:
            return "every"  # "which functions call", "what files import" (not "which verbs does X.parse accept")
        if w[0] not in _AUX and plural(w[1]) and PARTS.match(w[1]) and (w[2] in _AUX or not w[2]):
            return "every"  # "what test files does it import"
        if words and w[0] not in _AUX:
            return None  # "which function returns all items / the number of loops": about one thing
    if _COUNT.search(t) or _ENUM.search(t):
        return "every"
    show = _SHOW.search(t)
    if show is not None and (plural(show.group(1)) or (show.group(1) not in _DET and plural(show.group(2) or ""))):
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


def asking(request: str) -> list[str]:
    """The request's sentences (identifiers blanked) that ask something: a question, an imperative, a
    "please", or a summary asked for in a few words ("tl;dr of the file"); not a statement of what happens."""
    return [p for p in sentences(prose(request or "")) if asks(p) or _REQUESTING.search(p.lower())]


def sentences(text: str) -> list[str]:
    """``text`` split into its sentences (at ``.``, ``?``, ``!`` and line breaks), empty ones dropped."""
    return [p for p in _SENTENCE.split(text.strip()) if p.strip()]
