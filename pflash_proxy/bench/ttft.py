"""``bench ttft``: how much sooner the first token comes, measured against a real llama-server.

1. One llama-server (spawned like ``--spawn``, or ``--upstream``) and two in-process proxies in front of it:
   ``pflash`` (PFlash on, the first available scorer) and ``full`` (``pflash=False``: the same proxy, sessions
   and all, full prefill).  Every run's first message starts with a unique salt line, so no run reuses another
   run's prefix cache (the cached tokens are recorded to show it); after each run the proxy snapshots its sessions
   (``/pflash/save``, untimed) so no later run pays for saving a displaced one.
2. Lengths: ``--prompts`` prompts per length (families cycle through a sectioned document, a prose retrieval
   case and a code case, each sized in the upstream's tokens and capped at one slot), the two arms interleaved
   (the order alternates).  First-token time = streaming, time to the first content chunk; prefill tokens from
   llama-server's ``timings`` (``ChatResult.report``).
3. Chat replay at the shortest length, each arm in turn: a long document (turn 1), a short follow-up, a long
   paste (turn 3, half as long, at least 1.25× the threshold), a short follow-up; the model's own replies are
   kept.  Per-turn and whole-chat waiting time.  It runs before step 2, and its first turn is step 2's first
   prompt at that length (the same sectioned document, salted the same way), so that prompt is not sent twice.
4. Resume after a restart, at the shortest length only: a new PFlash conversation over the replay's document is
   snapshotted (``/pflash/save``), llama-server is restarted, and its follow-up is asked through the proxy
   (``restored`` from SSD), then straight to llama-server with every slot erased: the same served prompt cold, and
   (not with ``--quick``) the original unshortened prompt cold (no PFlash).  Each row records the first-token time
   and the cached tokens, so the table shows what a restore saves over a cold prefill.  Skipped with ``--upstream``
   (the bench cannot restart it).
5. The drafter's own cost (represent + score, when a drafter scorer is used) and a GPU projection computed from
   the measured token counts: t(n) = (n + n²/(2Q)) / R, projected PFlash TTFT = compression time + t(kept).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Mapping, Sequence
import time
from pathlib import Path
from typing import NotRequired, TypedDict, Unpack

import aiohttp

from pflash_proxy.bench.arms import Arms, two_arms
from pflash_proxy.bench.cases import Case
from pflash_proxy.bench.report import Chart, Table, Written, mean, median, write_report
from pflash_proxy.bench.runner import ChatResult, Proxy, chat, new_id, salted
from pflash_proxy.bench.sizing import sized_case
from pflash_proxy.headers import CACHE_HEADER, MODE_HEADER
from pflash_proxy.progress import Progress
from pflash_proxy.jsontypes import ChatMessage, JSONValue
from pflash_proxy.llama.direct import erase_slot, pinned

# A sectioned document first: with one prompt (--quick, 4K) it is the shape lexical scores do not find flat.
PROMPT_FAMILIES = ("multiturn", "ruler_single", "code")
REPLY_TOKENS = 4  # chat replay: short replies, the waiting measured is mostly prefill
REPLAY_TURNS = 4  # chat replay: document, follow-up, paste, follow-up (``_replay_turns``)


class RowExtra(TypedDict, total=False):
    """What a step adds to a run's row: which prompt, turn or resume case it was."""

    length: int
    case_id: str
    case_tokens: JSONValue  # the case's real token count (``Case.meta``)
    from_replay: bool
    turn: int
    kind: str
    case: str
    saved: JSONValue  # what /pflash/save answered
    restart_s: float


class ReplayCase(TypedDict, total=False):
    """The replay's first turn names its case (the later turns: {})."""

    case_id: str
    case_tokens: JSONValue


class Row(RowExtra, total=False):
    """One request of the bench: the arm, what the client measured, what the proxy's headers and log said (every
    key but ``RowExtra``'s is always written; a report reads a row that was not found as ``{}``)."""

    arm: str
    status: int
    ttft_s: float
    total_s: float
    prefill_tokens: int | None
    cached_tokens: int | None
    prompt_tokens: int | None
    mode: str
    cache: str | None
    pflash_ms: float | None
    drafter_ms: float | None
    reply: str


class TtftRun(TypedDict):
    """``run``'s result, the report's input (written as ``ttft.json``, read back by ``--render``)."""

    bench: str
    quick: bool
    lengths: list[int]
    threshold: int
    prompts: int
    upstream: str
    scorer: NotRequired[str]
    slot_cap_tokens: NotRequired[int]
    replay: NotRequired[list[Row]]
    runs: NotRequired[list[Row]]
    resume: NotRequired[list[Row]]
    resume_error: NotRequired[str]
    seconds: NotRequired[float]


class ArmStats(TypedDict):
    ttft_mean: float | None
    ttft_median: float | None
    tokens: float | None
    pflash_ms: float | None
    modes: str
    cached: int


def _ms(value: JSONValue) -> float | None:
    """A log field that holds milliseconds (a number), or None."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _row(arm: str, res: ChatResult, proxy: Proxy | None, key: str | None, **extra: Unpack[RowExtra]) -> Row:
    fields = proxy.seen(key).fields if proxy is not None and key is not None and key in proxy.recorder.seen else {}
    report = res.report
    return {"arm": arm, "status": res.status, "ttft_s": round(res.ttft_s or 0, 3), "total_s": round(res.total_s, 3),
            "prefill_tokens": None if report is None else report.new_tokens,
            "cached_tokens": None if report is None else report.cached_tokens, "prompt_tokens": res.prompt_n,
            "mode": res.headers.get(MODE_HEADER, "off" if arm != "pflash" else "?"),
            "cache": res.headers.get(CACHE_HEADER), "pflash_ms": _ms(fields.get("pflash_ms")),
            "drafter_ms": _drafter_ms(fields), "reply": res.text[:80], **extra}


def _drafter_ms(fields: Mapping[str, JSONValue]) -> float | None:
    if fields.get("scorer") in (None, "lexical"):
        return None
    return round((_ms(fields.get("ms_represent", 0)) or 0) + (_ms(fields.get("ms_score", 0)) or 0), 1)


async def _one(http: aiohttp.ClientSession, arm: str, proxy: Proxy, messages: Sequence[ChatMessage],
               **extra: Unpack[RowExtra]) -> Row:
    key = new_id()
    res = await chat(http, proxy.url, messages, bench_id=key)
    async with http.post(proxy.url + "/pflash/save") as r:
        await r.read()
    return _row(arm, res, proxy, key, **extra)


def _step(bar: Progress | None, note: str, n: int = 1) -> None:
    if bar is not None:
        bar.advance(note, n)


async def _lengths(a: Arms, opts: argparse.Namespace, replay: list[Row], bar: Progress | None = None) -> list[Row]:
    out: list[Row] = []
    http, arms = a.http, {"full": a.full, "pflash": a.pflash}
    for n in opts.lengths:
        for i in range(opts.prompts):
            fam = PROMPT_FAMILIES[i % len(PROMPT_FAMILIES)]
            case = await sized_case(a.count, fam, n, i // len(PROMPT_FAMILIES), opts.seed, a.cap)
            turn1 = [r for r in replay if r["turn"] == 1 and r.get("case_id") == case.case_id]
            if len(turn1) == 2:  # the replay's first turn was this very prompt, salted, in both arms
                out.extend(Row({**r, "length": n, "from_replay": True}) for r in turn1)
                _step(bar, f"{case.case_id} (from the replay)", 2)
                continue
            order = ["full", "pflash"] if i % 2 == 0 else ["pflash", "full"]
            for arm in order:
                row = await _one(http, arm, arms[arm], salted(case.messages, new_id()), length=n,
                                 case_id=case.case_id, case_tokens=case.meta["real_tokens"])
                out.append(row)
                _step(bar, f"{case.case_id} {arm}")
                if opts.verbose:
                    line = f"  ttft {case.case_id} {arm}: {row['ttft_s']} s, {row['prefill_tokens']} tok"
                    if bar is not None:
                        bar.write(line)
                    else:
                        print(line, file=sys.stderr, flush=True)
    return out


def _paste_tokens(opts: argparse.Namespace) -> int:
    """The paste is half the document but at least 1.25× the admission threshold (a long message on its own)."""
    return int(max(min(opts.lengths) // 2, opts.threshold + opts.threshold // 4))


async def _document(a: Arms, opts: argparse.Namespace) -> Case:
    """The replay's (and resume's) sectioned document; document and paste together must fit one slot
    (gemma's is 32K), so the document gives way if needed."""
    doc_n = min(min(opts.lengths), a.cap - _paste_tokens(opts) - 256)
    return await sized_case(a.count, "multiturn", doc_n, 0, opts.seed, a.cap)


async def _replay_turns(a: Arms, opts: argparse.Namespace) -> tuple[Case, list[str | tuple[str, str]]]:
    doc = await _document(a, opts)
    paste = await sized_case(a.count, "ruler_single", _paste_tokens(opts), 0, opts.seed + 1, a.cap)
    text = paste.messages[0].get("content")
    if not isinstance(text, str):  # a generated case's message is one string
        raise TypeError(f"case {paste.case_id}: the first message's content is not a string")
    return doc, [doc.followups[0].question, ("paste", text), doc.followups[1].question]


async def _replay(a: Arms, opts: argparse.Namespace, bar: Progress | None = None) -> list[Row]:
    doc, later = await _replay_turns(a, opts)
    out: list[Row] = []
    arms = {"full": a.full, "pflash": a.pflash}
    case: ReplayCase = {"case_id": doc.case_id, "case_tokens": doc.meta["real_tokens"]}
    for arm in ("pflash", "full"):
        msgs = salted(doc.messages, new_id())
        kinds = ["long document"] + ["long paste" if isinstance(t, tuple) else "short follow-up" for t in later]
        for turn, kind in enumerate(kinds):
            if turn:
                item = later[turn - 1]
                msgs = msgs + [{"role": "user", "content": item[1] if isinstance(item, tuple) else item}]
            key = new_id()
            res = await chat(a.http, arms[arm].url, msgs, bench_id=key, max_tokens=REPLY_TOKENS)
            out.append(_row(arm, res, arms[arm], key, turn=turn + 1, kind=kind, **(case if turn == 0 else {})))
            _step(bar, f"chat replay {arm} turn {turn + 1}")
            msgs = msgs + [{"role": "assistant", "content": res.text}]
    return out


async def _resume(a: Arms, opts: argparse.Namespace) -> list[Row]:
    http, llama, proxy = a.http, a.llama, a.pflash
    doc = await _document(a, opts)  # a new conversation (new salt) over the replay's document
    msgs = salted(doc.messages, new_id())
    first = await chat(http, proxy.url, msgs, max_tokens=REPLY_TOKENS)
    async with http.post(proxy.url + "/pflash/save") as r:
        saved = (await r.json()).get("saved")
    restart_s = await llama.restart()
    for _ in range(40):  # let the proxies' health monitors see the restart before asking again
        async with http.get(proxy.url + "/pflash/stats") as r:
            if (await r.json()).get("sessions", {}).get("upstream_restarts", 0) >= 1:
                break
        await asyncio.sleep(0.25)
    follow = msgs + [{"role": "assistant", "content": first.text},
                     {"role": "user", "content": doc.followups[0].question}]
    key = new_id()
    res = await chat(http, proxy.url, follow, bench_id=key)
    out = [_row("pflash", res, proxy, key, case="resume from SSD snapshot", saved=saved,
                restart_s=round(restart_s, 1))]
    served = proxy.seen(key).messages
    # Direct calls use fresh connections: llama-server may close a kept-alive one after a streamed answer.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True),
                                     timeout=aiohttp.ClientTimeout(total=None, sock_read=1800)) as direct:
        colds = [("cold: same served prompt, slots erased", served), ("cold: original prompt, no PFlash", follow)]
        for label, messages in colds[:1] if opts.quick else colds:  # --quick: the one cold run resume replaces
            for slot in range(llama.parallel):
                await erase_slot(direct, llama.url, slot)
            res = await chat(direct, llama.url, messages, extra_fields=pinned(0))  # every cold run on slot 0
            out.append(_row("direct", res, None, None, case=label))
    return out


async def run(opts: argparse.Namespace) -> TtftRun:
    t0 = time.perf_counter()
    data: TtftRun = {"bench": "ttft", "quick": opts.quick, "lengths": list(opts.lengths),
                            "threshold": opts.threshold, "prompts": opts.prompts,
                            "upstream": opts.upstream or "spawned gemma-3-270m (CPU)"}
    async with two_arms(opts, ctx_factor=1.6) as a:
        data["scorer"] = a.scorer_name
        data["slot_cap_tokens"] = a.cap
        # one step per request of the replay and of the lengths (both arms), and the resume step as one
        bar = Progress(2 * REPLAY_TURNS + 2 * len(opts.lengths) * opts.prompts + (not a.llama.external), "ttft")
        bar(0)
        try:
            data["replay"] = await _replay(a, opts, bar)
            data["runs"] = await _lengths(a, opts, data["replay"], bar)
            data["resume"] = []
            if not a.llama.external:
                try:
                    data["resume"] = await _resume(a, opts)
                except Exception as exc:  # noqa: BLE001 - keep the measurements already taken
                    data["resume_error"] = f"{type(exc).__name__}: {exc}"
                bar.advance("resume")
        finally:
            bar.close()
    data["seconds"] = round(time.perf_counter() - t0, 1)
    return data


def project(n: float, rate: float, quad: float) -> float:
    """Projected prefill seconds for n tokens: per-token cost (1 + x/Q)/R integrated over the prompt."""
    return (n + n * n / (2 * quad)) / rate


def tables(data: TtftRun, rate: float, quad: float) -> list[Table]:
    rows: list[list[object]] = []
    proj: list[list[object]] = []
    for n in data["lengths"]:
        arm_stats: dict[str, ArmStats] = {}
        for arm in ("full", "pflash"):
            sel = [r for r in data["runs"] if r["length"] == n and r["arm"] == arm]
            st: ArmStats = {"ttft_mean": mean([r["ttft_s"] for r in sel]), "ttft_median": median([r["ttft_s"] for r in sel]),
                  "tokens": mean([r["prompt_tokens"] for r in sel]), "pflash_ms": mean([r["pflash_ms"] for r in sel]),
                  "modes": ",".join(sorted({r["mode"] for r in sel})), "cached": max((r["cached_tokens"] or 0) for r in sel)}
            arm_stats[arm] = st
            rows.append([f"{n // 1024}K", arm, len(sel), st["modes"], st["tokens"], st["cached"], st["ttft_mean"],
                         st["ttft_median"], st["pflash_ms"]])
        f, p = arm_stats["full"], arm_stats["pflash"]
        if f["ttft_median"] and p["ttft_median"]:
            rows.append([f"{n // 1024}K", "speedup (median full / median pflash)", "", "", "", "", "",
                         f["ttft_median"] / p["ttft_median"], ""])
        if f["tokens"] and p["tokens"]:
            comp_s = (p["pflash_ms"] or 0) / 1000
            pf_full, pf_pf = project(f["tokens"], rate, quad), comp_s + project(p["tokens"], rate, quad)
            proj.append([f"{n // 1024}K", f["tokens"], p["tokens"], comp_s, pf_full, pf_pf, pf_full / pf_pf])
    out = [Table("First-token time, full prefill vs PFlash (interleaved, salted, streaming)",
                 ["length", "arm", "n", "mode", "prompt tokens (mean)", "max cached tokens", "TTFT mean s",
                  "TTFT median s", "compression ms (mean)"], rows)]
    per = []
    for n in data["lengths"]:
        for cid in dict.fromkeys(r["case_id"] for r in data["runs"] if r["length"] == n):
            by_arm = {r["arm"]: r for r in data["runs"] if r["case_id"] == cid}
            fr: Row = by_arm.get("full", {})
            pr: Row = by_arm.get("pflash", {})
            per.append([cid, fr.get("case_tokens") or fr.get("prompt_tokens"), fr.get("ttft_s"), pr.get("ttft_s"),
                        pr.get("mode"), pr.get("prompt_tokens"),
                        fr["ttft_s"] / pr["ttft_s"] if fr.get("ttft_s") and pr.get("ttft_s") else None])
    out.append(Table("Per prompt", ["case", "tokens", "full TTFT s", "pflash TTFT s", "pflash mode",
                                    "pflash prompt tokens", "speedup"], per))
    rep = data.get("replay", [])
    turns = sorted({r["turn"] for r in rep})
    body = []
    for t in turns:
        by_arm = {r["arm"]: r for r in rep if r["turn"] == t}
        fr = by_arm.get("full", {})
        pr = by_arm.get("pflash", {})
        body.append([t, (pr or fr).get("kind"), fr.get("ttft_s"), fr.get("prefill_tokens"), pr.get("ttft_s"),
                     pr.get("prefill_tokens"), pr.get("mode"), pr.get("cache")])
    if rep:
        tot = {arm: (sum(r["ttft_s"] for r in rep if r["arm"] == arm), sum(r["total_s"] for r in rep
                                                                            if r["arm"] == arm)) for arm in
               ("full", "pflash")}
        body.append(["whole chat", f"sum of TTFT (sum incl. {REPLY_TOKENS}-token replies)",
                     f"{tot['full'][0]:.1f} ({tot['full'][1]:.1f})", "", f"{tot['pflash'][0]:.1f} "
                     f"({tot['pflash'][1]:.1f})", "", "", ""])
    out.append(Table("Chat replay (per turn: first-token time s, prefilled tokens)",
                     ["turn", "kind", "full TTFT s", "full prefilled", "pflash TTFT s", "pflash prefilled",
                      "pflash mode", "proxy cache"], body))
    if data.get("resume"):
        out.append(Table("Resume after a llama-server restart vs cold",
                         ["case", "TTFT s", "prefilled tokens", "cached tokens", "proxy cache"],
                         [[r["case"], r["ttft_s"], r["prefill_tokens"], r["cached_tokens"], r.get("cache") or "–"]
                          for r in data["resume"]]))
    dms = [r["drafter_ms"] for r in data["runs"] if r.get("drafter_ms") is not None]
    out.append(Table("Drafter cost", ["scorer", "drafter ms (mean, represent+score)", "whole compression ms (mean)"],
                     [[data["scorer"], mean(dms) if dms else "no drafter",
                       mean([r["pflash_ms"] for r in data["runs"] if r["arm"] == "pflash"])]]))
    out.append(Table(f"GPU projection (a projection, not a measurement: R = {rate:.0f} tok/s, Q = {quad:.0f})",
                     ["length", "full tokens", "kept tokens", "compression s (measured here)",
                      "projected full TTFT s", "projected PFlash TTFT s", "projected speedup"], proj))
    return out


def report(data: TtftRun, out_dir: Path, opts: argparse.Namespace | None = None) -> Written:
    rate = getattr(opts, "gpu_prefill_tps", 8000.0)
    quad = getattr(opts, "gpu_quadratic_at", 65536.0)
    notes = [f"upstream: {data['upstream']}; scorer {data['scorer']}; threshold {data['threshold']}; "
             f"{data['prompts']} prompts per length; run took {data['seconds']} s",
             "cases sized in llama-server's own tokens to their length, capped at what one slot "
             f"holds with its reply ({data.get('slot_cap_tokens', '?')} tokens)",
             "chat replay (document, then a paste half as long, at least 1.25× the threshold) and resume at the "
             "shortest length",
             "arms: two in-process proxies on one llama-server, PFlash on vs off; every run salted at the start "
             "of its first message so no run reuses another's prefix cache (max cached tokens shows it)",
             "TTFT = time to the first streamed content chunk, measured by the client; both arms pay the same "
             "proxy overheads; PFlash's time includes exact token counting and compression",
             "projection assumptions: target prefill time t(n) = (n + n²/(2Q))/R (per-token cost grows linearly "
             "with position, doubling at Q tokens); PFlash = compression time as measured here (CPU, not "
             "accelerated) + drafter time + t(kept tokens); decode, network and queueing ignored",
             *([f"resume step failed: {data['resume_error']}"] if data.get("resume_error") else []),
             "on this machine (2 shared CPU cores, gemma-3-270m) absolute times are noisy; compare within a run"]
    return write_report(out_dir, "ttft", "PFlash time to first token", data, tables(data, rate, quad), notes,
                        chart(data))


def chart(data: TtftRun) -> Chart:
    """Median first-token time per length and the whole chat replay's waiting time, full vs PFlash."""
    cats = [f"{n // 1024}K" for n in data["lengths"]]
    series: dict[str, list[float | None]] = {}
    for arm, label in (("full", "full prefill"), ("pflash", "PFlash")):
        series[label] = [median([r["ttft_s"] for r in data["runs"] if r["length"] == n and r["arm"] == arm])
                         for n in data["lengths"]]
    if data.get("replay"):
        cats.append("chat replay (sum)")
        for arm, label in (("full", "full prefill"), ("pflash", "PFlash")):
            series[label].append(sum(r["ttft_s"] for r in data["replay"] if r["arm"] == arm))
    return Chart("Time to first token (median per length; whole chat: sum)", "seconds", cats, series)
