"""Code evidence for the `code` family and the agent "source" variant: real stdlib functions, docstrings removed.

Algorithm:
1. Candidate modules: top-level standard-library modules no larger than half the target, in seeded order.
2. In each module (parsed with `ast`, cached), a candidate is a function or method whose docstring is its own
   statement on its own lines, followed by at least one more statement; whose docstring's first sentence starts
   with a verb from `VERBS`, has 5–30 words and does not name the function; and whose body without the docstring
   is 4–80 lines.
3. The question is "Which function <that sentence, verb in the third person>? Give its name."
4. The module is shown with exactly the docstring's lines removed, so the function stays and its text without the
   docstring (decorators through last line) is one contiguous string: the gold.
5. The answer must be unambiguous: the function's `def name(` occurs once in its module, and filler modules that
   define the same name or contain the same sentence are never added.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import lru_cache

from pflash_proxy.bench.cases.base import Ctx, stdlib_modules

VERBS = frozenset("""return compute convert create build parse read write check find get set remove add format split
join make generate encode decode open close send load dump copy update search match replace translate calculate
determine extract print handle process escape quote unquote normalize resolve register append insert apply
construct initialize validate emit flush reset clear wait release acquire start stop run call retrieve locate strip
wrap fill compare count display test verify lookup look fetch collect yield iterate install remove save restore
indicate tell decide guess sort filter merge""".split())

_QUOTE_OPEN = re.compile(r"""^\s*[rRuU]?(\"\"\"|''')""")


@dataclass(frozen=True)
class CodeEvidence:
    path: str
    name: str
    qualname: str
    docstring: str
    sentence: str
    question: str
    gold: str
    block: str  # "# ===== path =====" header + the module without the docstring


def third_person(verb: str) -> str:
    v = verb.lower()
    if v in {"do", "go"}:
        return v + "es"
    if v.endswith(("s", "sh", "ch", "x", "z")):
        return v + "es"
    if v.endswith("y") and len(v) > 1 and v[-2] not in "aeiou":
        return v[:-1] + "ies"
    return v + "s"


def _question_phrase(sentence: str) -> str | None:
    words = sentence.rstrip(".").split(" ")
    first = words[0].lower()
    if first in VERBS:
        verb = third_person(first)
    elif first.endswith("s") and (first[:-1] in VERBS or first[:-2] in VERBS or first[:-3] + "y" in VERBS):
        verb = first
    else:
        return None
    return " ".join([verb] + words[1:])


def _first_sentence(doc: str) -> str | None:
    para = " ".join(doc.split("\n\n", 1)[0].split())
    m = re.match(r"(.+?[.?!])(?:\s|$)", para)
    if not m or not m.group(1).endswith(".") or ">>>" in para:
        return None
    s = m.group(1)
    return s if 5 <= len(s.split()) <= 30 else None


@lru_cache(maxsize=256)
def _candidates(path: str, src: str) -> tuple[tuple, ...]:
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return ()
    lines = src.split("\n")
    out = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                cand = _candidate(child, lines, prefix)
                if cand:
                    out.append(cand)
                visit(child, f"{prefix}{child.name}.")

    visit(tree, "")
    return tuple(out)


def _candidate(fn: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str], prefix: str) -> tuple | None:
    body = fn.body
    if fn.name.startswith("_") or fn.name.startswith("test") or len(body) < 2:
        return None
    doc = body[0]
    if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)):
        return None
    d0, d1 = doc.lineno, doc.end_lineno or doc.lineno
    if d0 <= fn.lineno or body[1].lineno <= d1 or not _QUOTE_OPEN.match(lines[d0 - 1]):
        return None
    if not lines[d1 - 1].rstrip().endswith(('"""', "'''")):
        return None
    start = min([fn.lineno] + [d.lineno for d in fn.decorator_list])
    end = fn.end_lineno or fn.lineno
    if not 4 <= (end - start + 1) - (d1 - d0 + 1) <= 80:
        return None
    docstring = ast.get_docstring(fn) or ""
    sentence = _first_sentence(docstring)
    if not sentence:
        return None
    plain = sentence.lower()
    if fn.name.lower() in plain or fn.name.replace("_", " ").lower() in plain:
        return None
    phrase = _question_phrase(sentence)
    if not phrase:
        return None
    return (fn.name, prefix + fn.name, start, d0, d1, end, docstring, sentence, phrase)


@lru_cache(maxsize=1)
def _normalized_modules() -> tuple[str, ...]:
    return tuple(" ".join(src.split()) for _, src in stdlib_modules())


def code_evidence(ctx: Ctx) -> CodeEvidence:
    mods = [(p, s) for p, s in stdlib_modules() if 1500 <= len(s) and ctx.count(s) <= ctx.target // 2]
    ctx.rng.shuffle(mods)
    for path, src in mods:
        cands = list(_candidates(path, src))
        ctx.rng.shuffle(cands)
        lines = src.split("\n")
        for name, qualname, start, d0, d1, end, docstring, sentence, phrase in cands:
            kept = lines[:d0 - 1] + lines[d1:]
            modified = "\n".join(kept)
            if modified.count(f"def {name}(") != 1 or sentence in " ".join(modified.split()):
                continue
            gold = "\n".join(lines[start - 1:d0 - 1] + lines[d1:end])
            return CodeEvidence(path, name, qualname, docstring, sentence, f"Which function {phrase}? Give its name.",
                                gold, f"# ===== {path} =====\n{modified}")
    raise RuntimeError("no documented stdlib function fits this target length")


def filler_modules(ev: CodeEvidence) -> list[str]:
    """Other whole modules, as "file read" blocks, that cannot make `ev`'s answer ambiguous."""
    out = []
    for (path, src), norm in zip(stdlib_modules(), _normalized_modules()):
        if path == ev.path or f"def {ev.name}(" in src or ev.sentence in norm:
            continue
        out.append(f"# ===== {path} =====\n{src}")
    return out
