"""Find the drafter's retrieval heads: a short planted-needle calibration, cached per drafter file.

Not every head of a global layer retrieves; some look at the sink, the previous line or nowhere in particular,
and under a max over heads (``attention.token_relevance``) such a head adds noise. Which heads retrieve is a
property of the drafter, so it is measured once per drafter file:

1. Tasks (``calibration_tasks``): a slice of Python standard-library *package* source (``email``, ``asyncio``,
   ... — never the top-level modules, prose or tables that ``bench`` draws from) with one planted comment line.
   Half are literal (``# Note: the vault code for the cedar annex is QX-4821.`` / "What is the vault code for
   the cedar annex?"), half latent (``# Mira spent last spring sketching the Eiffel Tower.`` / "Which person has
   been to Paris?": no content word in common; the link is what the drafter knows).
2. For every task one flash-on pass (``AttentionScorer.layer_attention``); per head, the rank of the needle's
   line among all lines by relevance density (mean over the line's tokens).
3. Heads are ordered by their mean reciprocal rank on the even tasks; the kept set is the best head plus every
   head within ``RATIO`` of it. That set is kept only if the max over it ranks the needle at least as well as
   the max over all heads on the odd tasks (held out); otherwise every head is used. Measured, not assumed.
4. The result (heads, per-head reciprocal ranks, both held-out mean ranks) is written atomically to
   ``$PFLASH_HOME/attention-heads/<drafter sha256>.json`` and read from there on every later start. A drafter
   with a packaged probe set that ships ``attention-heads.json`` (``drafter/trained/``; the gemma-3-270m one
   does) reads that file instead and never calibrates; a result in the home folder still comes first.
"""

from __future__ import annotations

import json
import logging
import os
import random
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NotRequired, Sequence, TypedDict

import numpy as np

from .attention import AttentionScorer, Head, token_relevance
from .segment import token_lines

log = logging.getLogger("pflash_proxy.drafter")

RATIO = 0.5  # a head is kept when its mean reciprocal rank is at least half the best head's
VERSION = 1

_THINGS = ["cedar annex", "north pumphouse", "granite archive", "willow depot", "copper gatehouse", "saffron wing",
           "tidal observatory", "juniper hangar", "basalt cellar", "linden signal box"]
_ATTRS = ["vault code", "backup passphrase", "badge number", "radio channel", "locker combination"]
# (landmark, city): none of these is in the bench's NOLIMA_TABLE
_LATENT = [("Eiffel Tower", "Paris"), ("Statue of Liberty", "New York"), ("Golden Gate Bridge", "San Francisco"),
           ("Forbidden City", "Beijing"), ("Sydney Opera House", "Sydney"), ("Red Square", "Moscow"),
           ("Alhambra", "Granada"), ("CN Tower", "Toronto"), ("Taj Mahal", "Agra"), ("Tower Bridge", "London")]
_PEOPLE = ["Mira", "Anselm", "Lucia", "Bertrand", "Oksana", "Dmitri", "Soledad", "Kwame", "Ilse", "Ravi"]
_LATENT_LINES = ["# {name} spent last spring sketching the {landmark}.",
                 "# {name} proposed to a partner on the steps of the {landmark}."]


@dataclass(frozen=True)
class Task:
    content: str
    question: str
    needle_line: int
    kind: str  # "literal" | "latent"


def _package_sources() -> list[str]:
    root = sysconfig.get_paths()["stdlib"]
    out = []
    for pkg in ("email", "asyncio", "http", "json", "logging", "xml", "concurrent", "importlib", "urllib"):
        top = os.path.join(root, pkg)
        for here, _dirs, files in sorted(os.walk(top)):
            for f in sorted(files):
                if f.endswith(".py"):
                    try:
                        with open(os.path.join(here, f), encoding="utf-8") as fh:
                            src = fh.read()
                    except (OSError, UnicodeDecodeError):
                        continue
                    if src.count("\n") > 150:
                        out.append(src)
    if not out:
        raise RuntimeError("no standard-library package sources to calibrate on")
    return out


def calibration_tasks(n: int = 8, chars: int = 6000, seed: int = 0) -> list[Task]:
    """Step 1: ``n`` tasks (alternately literal and latent) of about ``chars`` characters each."""
    rng = random.Random(seed)
    sources = _package_sources()
    tasks = []
    for i in range(n):
        lines = [x + "\n" for x in rng.choice(sources).split("\n")]  # "\n" lines, as token_lines counts them
        a = rng.randrange(0, max(1, len(lines) - 40))
        body: list[str] = []
        for line in lines[a:]:
            if sum(map(len, body)) >= chars:
                break
            body.append(line)
        at = rng.randrange(len(body) // 10, max(len(body) // 10 + 1, len(body) * 9 // 10))
        indent = body[at][:len(body[at]) - len(body[at].lstrip(" \t"))] if at < len(body) else ""
        if i % 2 == 0:
            thing, attr = rng.choice(_THINGS), rng.choice(_ATTRS)
            value = f"{rng.choice('QXZKV')}{rng.choice('RTWPM')}-{rng.randrange(1000, 9999)}"
            needle = f"# Note: the {attr} for the {thing} is {value}."
            question, kind = f"What is the {attr} for the {thing}?", "literal"
        else:
            (landmark, city), name = rng.choice(_LATENT), rng.choice(_PEOPLE)
            needle = rng.choice(_LATENT_LINES).format(name=name, landmark=landmark)
            question, kind = f"Which person has been to {city}?", "latent"
        body.insert(at, indent + needle + "\n")
        tasks.append(Task("".join(body), question, at, kind))
    return tasks


@dataclass(frozen=True)
class Read:
    """One task read by the drafter: each token's line and the per-layer attention of the question."""
    task: Task
    token_line: np.ndarray
    attention: dict[int, np.ndarray]

    def needle_rank(self, relevance: np.ndarray) -> int:
        """How many lines outscore the needle's line by mean relevance per token (0 = first)."""
        n = int(self.token_line.max()) + 1 if len(self.token_line) else 1
        dens = np.bincount(self.token_line, weights=relevance, minlength=n) / np.maximum(
            np.bincount(self.token_line, minlength=n), 1)
        return int((dens > dens[self.task.needle_line]).sum())


def read_task(scorer: AttentionScorer, task: Task) -> Read:
    """Step 2's pass: one flash-on forward of the task's content and question."""
    d = scorer.drafter
    toks = d.tokenize(task.content)
    return Read(task, token_lines(d.token_starts(task.content, toks), task.content),
                scorer.layer_attention(toks, task.question))


def needle_ranks(read: Read) -> dict[Head, int]:
    """Step 2: the needle line's rank under each head on its own."""
    return {(L, h): read.needle_rank(a[h]) for L, a in read.attention.items() for h in range(a.shape[0])}


class Calibration(TypedDict):
    """A calibration's result, as cached in ``HOME/attention-heads/<drafter sha256>.json``: heads as ``[layer,
    head]``, ``heads`` None when no subset beat every head; ``mrr`` keyed ``"layer.head"``."""

    version: int
    heads: list[list[int]] | None
    chosen: list[list[int]]
    mrr: dict[str, float]
    held_out_mean_rank_selected: float
    held_out_mean_rank_all: float
    tasks: int
    seconds: float
    drafter_sha256: NotRequired[str]


def calibrate(scorer: AttentionScorer, tasks: Sequence[Task]) -> Calibration:
    """Steps 2-3 over ``tasks``; returns the JSON-able result (``heads`` is None when all heads won)."""
    t0 = time.perf_counter()
    reads, ranks = [], []
    for i, task in enumerate(tasks):
        reads.append(read_task(scorer, task))
        ranks.append(needle_ranks(reads[-1]))
        log.info("attention calibration: task %d/%d (%s) needle line rank, best head %d", i + 1, len(tasks),
                 task.kind, min(ranks[-1].values()))
    heads = sorted(ranks[0])
    fit, held = list(range(0, len(tasks), 2)), list(range(1, len(tasks), 2)) or [0]
    mrr = {h: float(np.mean([1.0 / (1 + ranks[i][h]) for i in fit])) for h in heads}
    best = max(mrr.values())
    chosen = [h for h in heads if mrr[h] >= RATIO * best]
    sel = [reads[i].needle_rank(token_relevance(reads[i].attention, frozenset(chosen))) for i in held]
    every = [reads[i].needle_rank(token_relevance(reads[i].attention, None)) for i in held]
    keep = float(np.mean(sel)) <= float(np.mean(every))
    return {"version": VERSION, "heads": [list(h) for h in chosen] if keep else None,
            "chosen": [list(h) for h in chosen], "mrr": {f"{L}.{h}": v for (L, h), v in mrr.items()},
            "held_out_mean_rank_selected": float(np.mean(sel)), "held_out_mean_rank_all": float(np.mean(every)),
            "tasks": len(tasks), "seconds": round(time.perf_counter() - t0, 1)}


def cache_path(home: Path, drafter_sha256: str) -> Path:
    return Path(home) / "attention-heads" / f"{drafter_sha256}.json"


def load_or_calibrate(scorer: AttentionScorer, home: Path, drafter_sha256: str, n_tasks: int = 8,
                      chars: int = 6000) -> Calibration:
    """Step 4: the cached result for this drafter file, or a fresh calibration written atomically."""
    path = cache_path(home, drafter_sha256)
    try:
        got: Calibration = json.loads(path.read_text())  # as ``calibrate`` wrote it (checked: version, heads)
        if got.get("version") == VERSION and "heads" in got:
            return got
    except (OSError, ValueError):
        pass
    from .trained import attention_heads

    shipped = attention_heads(drafter_sha256)
    if shipped is not None:
        try:
            got = json.loads(shipped.read_text())  # the packaged result, written by ``calibrate`` too
            if got.get("version") == VERSION and "heads" in got and got.get("drafter_sha256") == drafter_sha256:
                return got
        except (OSError, ValueError):
            log.warning("attention calibration: the packaged %s is unreadable; calibrating", shipped)
    log.info("attention calibration: finding the retrieval heads of %s (%d planted-needle tasks, once per "
             "drafter file)", os.path.basename(scorer.drafter.path), n_tasks)
    result = calibrate(scorer, calibration_tasks(n_tasks, chars))
    result["drafter_sha256"] = drafter_sha256
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".calib-", suffix=".json")
    with os.fdopen(fd, "w") as fh:
        json.dump(result, fh, indent=1)
    os.replace(tmp, path)
    log.info("attention calibration: %s heads %s (held-out mean needle rank %.1f selected vs %.1f all) in %.0f s",
             "keeping" if result["heads"] else "no subset beat all heads; using all, not", result["chosen"],
             result["held_out_mean_rank_selected"], result["held_out_mean_rank_all"], result["seconds"])
    return result


def apply(scorer: AttentionScorer, result: Calibration) -> AttentionScorer:
    """A scorer on the same drafter restricted to the calibrated heads (unchanged when all heads won)."""
    heads = result.get("heads")
    if not heads:
        return scorer
    return AttentionScorer(scorer.drafter, heads=[(layer, head) for layer, head in heads], keys=scorer.keys)


def calibrated(scorer: AttentionScorer, home: Path, hash_cache: Path | None = None) -> AttentionScorer:
    """Steps 1-4 for ``scorer``'s drafter file (``--attention-heads auto``): the scorer on its retrieval heads."""
    from .hashing import file_sha256

    return apply(scorer, load_or_calibrate(scorer, home, file_sha256(scorer.drafter.path, hash_cache)))
