"""``pflash-proxy show [SESSION]``: the inspector in a terminal, read from the running proxy's ``/pflash/api``.

Without SESSION: the most recently used sessions, one line each (the client, the last turn's cache result, tokens
compression saved, tokens reused from the slot, the time saved, an estimate, and the first words). With one (its
full id or a unique prefix of a listed one): each turn — what the slot held, the engine's cached and
prefilled tokens, the tokens compression kept from the prefill, the time saved (estimated), why a message was
served whole — then every served message; a compressed (or whole-served) message is printed from its original
lines — kept lines plain with their line numbers (``>`` marks the request span), each run of omitted units as one
line ``… 37 lines omitted (unit 12, score 0.03)`` — under a header with the mode, tokens, budget and scorer;
recall excerpts with the message and lines they came from. An unreachable proxy (the message names ``--url``), a
refusal or an unknown session is one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TextIO

from pflash_proxy.sessions.trace_records import CompressionView, RecallView, TurnView, UnitView
from pflash_proxy.stats import SessionSavings

if TYPE_CHECKING:
    from pflash_proxy.config import Settings

PLAIN_LINES = 12  # a message without a trace longer than this is shown by its first lines


class ShowError(Exception):
    """One line for stderr."""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("show", help="show what the model read: a session's messages, kept and omitted lines",
                       description="List sessions, or show one session as the inspector (/pflash/ui) does.")
    p.add_argument("session", nargs="?", help="session id (or a unique prefix of a recent one); none: list sessions")
    p.add_argument("--proxy", "--url", dest="url", metavar="URL",
                   help="the running proxy (default http://HOST:PORT from the configuration)")
    p.add_argument("--api-key", dest="key", metavar="KEY",
                   help="bearer token for a proxy on another host (default $PFLASH_API_KEY)")
    p.add_argument("--json", action="store_true", help="print the API's JSON")
    p.add_argument("--config", help="TOML configuration file (for the default URL)")


def main(args: argparse.Namespace, settings: Settings) -> int:
    base = (args.url or settings.proxy.local_url).rstrip("/")
    key = args.key or settings.inspector.api_key  # the inspector key: PFLASH_API_KEY or the configuration file
    try:
        if not args.session:
            data = get(base, "/pflash/api/sessions", key)
            if args.json:
                _dump(data)
            else:
                print_sessions(data, sys.stdout)
            return 0
        sid = resolve(base, args.session, key)
        data = get(base, f"/pflash/api/sessions/{sid}", key)
        if args.json:
            _dump(data)
        else:
            print_session(data, sys.stdout)
        return 0
    except ShowError as exc:
        print(f"pflash-proxy show: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `| head`
        return 0


def get(base: str, path: str, key: str | None) -> dict[str, Any]:
    headers = {"Accept": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(base + path, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read())["error"]["message"]
        except Exception:  # noqa: BLE001 - not the proxy's JSON error
            message = exc.reason
        raise ShowError(f"{base}{path}: {exc.code} {message}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        reason = getattr(reason, "strerror", None) or reason
        raise ShowError(f"cannot reach the proxy at {base} ({reason}); is it running there? Give its address "
                        "with --url http://HOST:PORT") from None
    except ValueError:
        raise ShowError(f"{base}{path} did not answer JSON (is {base} a pflash-proxy?)") from None


def resolve(base: str, given: str, key: str | None) -> str:
    """A full id as it is; a prefix among the listed (recent) sessions."""
    given = given.strip().lower()
    if len(given) == 32:
        return given
    ids = [s["id"] for s in get(base, "/pflash/api/sessions", key)["sessions"] if s["id"].startswith(given)]
    if len(ids) != 1:
        raise ShowError(f"{given!r} matches {len(ids)} of the recent sessions; give the full id")
    return ids[0]


def _dump(data: object) -> None:
    json.dump(data, sys.stdout, indent=2)
    sys.stdout.write("\n")


def _n(x: object) -> str:
    return "–" if x is None else f"{x:,}"


def _score(s: float) -> str:
    return f"{s:.0f}" if s >= 10 else f"{s:.2g}"


def _ago(epoch: float | None) -> str:
    if not epoch:
        return "–"
    s = max(0.0, time.time() - epoch)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s / size:.0f}{unit} ago"
    return f"{s:.0f}s ago"


def _lines(a: int, b: int) -> str:
    return f"line {a + 1}" if b - a == 1 else f"lines {a + 1}–{b}"


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def _secs(s: float | None) -> str:
    if s is None:
        return "–"
    return f"{s:.1f}s" if s >= 10 else f"{s:.2f}s" if s >= 1 else f"{s * 1000:.0f}ms"


def _savings(summary: Mapping[str, object]) -> SessionSavings | None:
    """A session summary's savings, typed (None: an older proxy's summary without them)."""
    v = summary.get("savings")
    return SessionSavings.from_json(v) if isinstance(v, Mapping) else None


def _saved(turn: TurnView | None) -> float | None:
    """A turn's estimated seconds saved, both causes (None: the engine did not time it)."""
    if not turn:
        return None
    saved = turn.get("saved_s")
    values = [v for v in (saved.get("compression"), saved.get("cache")) if v is not None] if saved else []
    return sum(values) if values else None


def print_sessions(data: dict[str, Any], out: TextIO) -> None:
    sessions = data.get("sessions") or []
    out.write(f"{'SESSION':<34} {'CLIENT':<12} {'LAST USE':>9} {'TURNS':>5} {'CACHE':>8} {'COMPR':>5} "
              f"{'TOKENS IN':>10} {'SAVED':>8} {'CACHED':>9} {'TIME SAVED':>10} {'SLOT':>4} {'SNAPSHOT':>9}  "
              "FIRST WORDS\n")
    for s in sessions:
        snap = f"{s['snapshot']['bytes'] / 1e6:.1f}MB" if s.get("snapshot") else "–"
        slot = "–" if s.get("slot") is None else str(s["slot"])
        v = _savings(s)
        saved = v.saved_total if v is not None and v.turns_timed else None
        words = s.get("first_words") or ""
        out.write(f"{s['id']:<34} {(s.get('client') or '–')[:12]:<12} {_ago(s['last_use']):>9} {s['turns']:>5} "
                  f"{s.get('last_cache') or '–':>8} {s['compressed']:>5} {_n(s['tokens_in']):>10} "
                  f"{_n(s['tokens_saved']):>8} {_n(v.cached_tokens if v is not None else None):>9} "
                  f"{('≈' + _secs(saved)) if saved is not None else '–':>10} {slot:>4} {snap:>9}  "
                  f"{words[:40]}{'…' if len(words) > 40 else ''}\n")
    total = data.get("total", len(sessions))
    more = f" (the {len(sessions)} most recent shown)" if total > len(sessions) else ""
    out.write(f"{_plural(total, 'session')}{more}; `pflash-proxy show SESSION` for one. TOKENS IN / SAVED: new long "
              "messages and what compression cut of them; CACHED: prompt tokens reused from the slot; TIME SAVED: "
              "an estimate at the prefill rate llama-server reported\n")


def print_session(data: dict[str, Any], out: TextIO) -> None:
    s = data["session"]
    snap = f", snapshot {_n(s['snapshot']['tokens'])} tokens ({s['snapshot']['bytes'] / 1e6:.1f} MB)" \
        if s.get("snapshot") else ""
    client = f" ({s['client']})" if s.get("client") else ""
    out.write(f"session {s['id']}{client}: {_plural(s['turns'], 'turn')}, {_plural(s['messages'], 'message')}, "
              f"last use {_ago(s['last_use'])}; {s['compressed']} compressed, tokens {_n(s['tokens_in'])} → "
              f"{_n(s['tokens_served'])} ({_n(s['tokens_saved'])} saved by compression), {s['recalls']} "
              f"recall(s){snap}\n")
    v = _savings(s)
    if v is not None and v.turns_timed:
        avoided, saved = v.tokens_avoided, v.saved_s
        rate = f" at {v.rate_tps:,.0f} tokens/s" if v.rate_tps else ""
        out.write(f"prefill: {_n(v.prefilled_tokens)} tokens prefilled in {_secs(v.prefill_s)}, "
                  f"{_n(v.cached_tokens)} reused from the slot; time saved ≈ {_secs(v.saved_total)} "
                  f"(compression {_secs(saved.compression)} for {_n(int(avoided.compression))} tokens, "
                  f"cache {_secs(saved.cache)} for {_n(int(avoided.cache))} tokens; an estimate{rate})\n")
    turns = data.get("turns") or []
    if turns:
        out.write("\n── turns " + "─" * 40 + "\n")
        for t in turns:
            print_turn(t, out)
    traces = data.get("traces") or []
    for m in data["messages"]:
        mine = [traces[i] for i in m.get("traces", [])]
        turn = f", served in turn {mine[0]['turn']}" if mine else ""
        out.write(f"\n── message {m['index'] + 1} ({m.get('role')}{turn}) " + "─" * 40 + "\n")
        for t in mine:
            if t["kind"] == "recall":
                print_recall(t, out)
        compressions = [t for t in mine if t["kind"] == "compression"]
        for t in compressions:
            print_trace(t, out)
        if not compressions:
            lines = (m.get("text") or "").split("\n")
            for line in lines[:PLAIN_LINES]:
                out.write(f"      │ {line}\n")
            if len(lines) > PLAIN_LINES:
                out.write(f"      … {len(lines) - PLAIN_LINES:,} more lines (as served)\n")


def print_turn(t: TurnView, out: TextIO) -> None:
    """One turn: what the slot held, the engine's counts, what was avoided and the time saved (an estimate)."""
    head = f"turn {t['turn']}: {t.get('cache')}"
    prefilled, prefill_ms = t.get("prefilled_tokens"), t.get("prefill_ms")
    if prefilled is None:
        out.write(f"{head}, no cache report from the engine (status {t.get('status')})\n")
    else:
        avoided, saved = t.get("tokens_avoided"), t.get("saved_s")
        prefill = f" in {_secs(prefill_ms / 1000)}" if prefill_ms is not None else ""
        out.write(f"{head}, cached {_n(t['cached_tokens'])}, prefilled {_n(prefilled)}{prefill}, "
                  f"{_n(avoided.get('compression') if avoided else None)} not prefilled thanks to compression; "
                  f"time saved ≈ {_secs(_saved(t))} (compression {_secs(saved.get('compression') if saved else None)}"
                  f", cache {_secs(saved.get('cache') if saved else None)}; estimate)\n")
    if t.get("why"):
        out.write(f"  {t['why']}\n")
    for m in t.get("messages") or []:
        if m.get("why"):
            out.write(f"  message {m['message'] + 1} served whole: {m['why']}\n")


def print_trace(t: CompressionView, out: TextIO) -> None:
    units = t.get("units") or []
    kept = sum(1 for u in units if u["kept"])
    head = [t["mode"], f"{_n(t['message_tokens'])} → {_n(t['served_tokens'])} tokens", f"budget {_n(t['budget'])}",
            f"prompt {_n(t['prompt_tokens'])}", f"scorer {t['scorer']}"]
    if units:
        head.append(f"{kept}/{len(units)} units kept")
    spread = t.get("spread")
    if spread is not None:
        head.append(f"spread {spread:.3f}")
    out.write("[" + " · ".join(head) + "]\n")
    if t.get("reason"):
        out.write(f"served whole: {t['reason']}\n")
    req = t.get("request")
    span, source, asked = (req.get("lines"), req.get("source"), req.get("text")) if req else (None, None, None)
    if source and source != "none":
        where = f", {_lines(*span)}, marked >" if span else ""
        text = " ".join((asked or "").split())
        out.write(f"request from {source}{where}: {text[:200]}{'…' if len(text) > 200 else ''}\n")
    lines = t.get("lines")
    if lines is None:
        if t.get("text_dropped"):
            out.write("(the original text of this older trace is no longer kept; units below)\n")
        for u in units:
            a, b = u["lines"]
            out.write(f"  unit {u['index']}: {_lines(a, b)}, {_n(u['tokens'])} tokens, score {_score(u['score'])}"
                      f"{'' if u['kept'] else ' (omitted)'}\n")
        return
    if not units:  # served whole without units: the lines as they are
        units = [{"index": 0, "lines": [0, len(lines)], "kept": True, "score": 0.0, "tokens": 0, "pinned": False}]
    width = len(str(len(lines)))
    run: list[UnitView] = []
    for unit in units + [None]:
        if unit is not None and not unit["kept"]:
            run.append(unit)
            continue
        if run:
            n = run[-1]["lines"][1] - run[0]["lines"][0]
            if len(run) == 1:
                which = f"unit {run[0]['index']}, score {_score(run[0]['score'])}"
            else:
                lo, hi = _score(min(r["score"] for r in run)), _score(max(r["score"] for r in run))
                which = f"units {run[0]['index']}–{run[-1]['index']}, scores {lo}" + (f"–{hi}" if hi != lo else "")
            out.write(f"{'':>{width}}   … {_plural(n, 'line')} omitted ({which})\n")
            run = []
        if unit is None:
            break
        a, b = unit["lines"]
        for i in range(a, b):
            mark = ">" if span and span[0] <= i < span[1] else " "
            out.write(f"{i + 1:>{width}} {mark}│ {lines[i]}\n")


def print_recall(t: RecallView, out: TextIO) -> None:
    out.write(f"[recall · {_plural(len(t['excerpts']), 'excerpt')} prepended · omitted share {t['share']:.3f}]\n")
    for e in t["excerpts"]:
        a, b = e["lines"]
        out.write(f"  from message {e['from_message']}, {_lines(a, b)} ({_n(e['tokens'])} tokens)\n")
