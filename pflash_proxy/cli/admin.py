"""Admin commands: ``ls``, ``rm``, ``stats``, ``warm``.

``ls``/``rm`` read the snapshot index directly (SQLite is safe to share with a running proxy, and so is the diskcache
index an older proxy may still serve from; a shared ``--index redis://`` is read the same way, and ``ls`` then
names each session's node and the live nodes);
``stats`` (a summary table; ``--json``: all of ``/pflash/stats``) and ``warm`` talk to the running proxy over HTTP;
a proxy that does not answer is one line naming ``--url``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import cast

from pflash_proxy.config import Settings


def run(args: argparse.Namespace, settings: Settings) -> int:
    try:
        return {"ls": cmd_ls, "rm": cmd_rm, "stats": cmd_stats, "warm": cmd_warm}[args.command](args, settings)
    except _Refused as exc:
        print(f"pflash-proxy {args.command}: {exc}", file=sys.stderr)
        return 1


class _Refused(Exception):
    """The state directory is not this user's own (``cli.home.check_home``): ``ls``/``rm`` read nothing from it."""


def _store_and_snapshots(settings: Settings):
    """The index and a delete-only snapshot manager, from a state directory ``check_home`` trusts (an index in a
    directory others can write into could name any file for ``rm`` to delete, or show planted sessions)."""
    import sqlite3

    from pflash_proxy.cli.home import Untrusted, check_home
    from pflash_proxy.sessions.index import SessionIndex, open_index
    from pflash_proxy.sessions.index.legacy import FILE as OLD_FILE, DiskcacheReader
    from pflash_proxy.sessions.snapshots import SnapshotManager

    try:
        check_home(settings.proxy.home)
    except Untrusted as exc:
        raise _Refused(str(exc)) from None
    directory = settings.proxy.home / "sessions"
    if not settings.cluster.shared and (directory / OLD_FILE).exists():
        # a home an older proxy (diskcache) may still serve from: read its index where it is; only ``serve`` moves
        # it into SQLite, never a command that takes no lock beside a proxy that may still be writing it
        try:
            # ls and rm call what the reader has: snapshots, drop_snapshot (SnapshotManager.delete), as_cluster, close
            store = cast("SessionIndex", DiskcacheReader(directory))
        except sqlite3.Error as exc:
            raise _Refused(f"cannot read the diskcache index in {directory} ({exc})") from None
    else:
        store = open_index(settings.proxy.home, settings.cluster.index)
    return store, SnapshotManager(store, None, settings.effective_slot_save_path, 0)  # deletes, never saves


def cmd_ls(args: argparse.Namespace, settings: Settings) -> int:
    store, _ = _store_and_snapshots(settings)
    snaps = sorted(store.snapshots(), key=lambda r: -r.last_use)
    # a shared index (--index redis://) also says which node holds each session and which nodes are alive
    shared = store.as_cluster()
    holders: dict[str, str] = shared.holders() if shared is not None else {}
    nodes: dict[str, str] = shared.nodes() if shared is not None else {}
    store.close()
    if args.json:
        print(json.dumps([{**s.__dict__, **({"node": holders.get(s.session)} if nodes or holders else {})}
                          for s in snaps], indent=2))
        return 0
    node_col = f" {'NODE':<24}" if holders or nodes else ""
    print(f"{'SESSION':<34} {'TOKENS':>8} {'SIZE':>10} {'AGE':>8} {'HITS':>5}{node_col}")
    now = time.time()
    for s in snaps:
        node = f" {holders.get(s.session, '-'):<24}" if node_col else ""
        print(f"{s.session:<34} {s.tokens:>8} {s.size / 1e6:>8.1f}MB {_age(now - s.last_use):>8} {s.hits:>5}{node}")
    print(f"{len(snaps)} snapshots, {sum(s.size for s in snaps) / 1e6:.1f} MB in {settings.effective_slot_save_path}")
    if node_col:
        alive = ", ".join(f"{n} ({u.split(' sig=', 1)[0]})" for n, u in sorted(nodes.items())) or "none"
        print(f"{len(holders)} sessions held; nodes alive: {alive}")
    return 0


def cmd_rm(args: argparse.Namespace, settings: Settings) -> int:
    if not args.ids and not args.all:
        print("pflash-proxy rm: give session ids (or unique prefixes) or --all", file=sys.stderr)
        return 2
    store, snaps = _store_and_snapshots(settings)
    try:
        existing = [s.session for s in store.snapshots()]
        targets = existing if args.all else []
        for prefix in args.ids:
            matches = [sid for sid in existing if sid.startswith(prefix)]
            if len(matches) != 1:
                print(f"pflash-proxy rm: {prefix!r} matches {len(matches)} snapshots", file=sys.stderr)
                return 1
            targets.append(matches[0])
        for sid in targets:
            snaps.delete(sid)
        print(f"removed {len(targets)} snapshot(s)")
        return 0
    finally:
        store.close()


def _proxy_url(args: argparse.Namespace, settings: Settings) -> str:
    return (getattr(args, "url", None) or settings.proxy.local_url).rstrip("/")


def _http(method: str, url: str, payload: dict | None = None, timeout: float = 3600) -> dict:
    data = json.dumps(payload).encode() if payload is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read() or b"{}")


def unreachable(command: str, base: str, exc: BaseException) -> str:
    """One line for a proxy that does not answer at ``base``: the reason, and how to name another address."""
    reason = getattr(exc, "reason", exc)
    reason = getattr(reason, "strerror", None) or reason
    return (f"pflash-proxy {command}: cannot reach the proxy at {base} ({reason}); is it running there? Give its "
            "address with --url http://HOST:PORT")


def cmd_stats(args: argparse.Namespace, settings: Settings) -> int:
    base = _proxy_url(args, settings)
    try:
        data = _http("GET", base + "/pflash/stats", timeout=10)
    except urllib.error.HTTPError as exc:
        print(f"pflash-proxy stats: {base}/pflash/stats answered {exc.code} {exc.reason}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as exc:
        print(unreachable("stats", base, exc), file=sys.stderr)
        return 1
    except ValueError:
        print(f"pflash-proxy stats: {base}/pflash/stats did not answer JSON (is {base} a pflash-proxy?)",
              file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(summary(base, data))
    return 0


def summary(base: str, data: dict) -> str:
    """``/pflash/stats`` as a table a person reads: one row per concern."""
    def n(x: object) -> str:
        return f"{x:,}" if isinstance(x, (int, float)) else "–"

    def secs(x: float | None) -> str:
        return "–" if x is None else f"{x:.1f} s" if x >= 10 else f"{x:.2f} s"

    rows: list[tuple[str, str]] = []
    up = data.get("upstream") or {}
    state = "ready" if up.get("ready") else f"not ready ({up.get('not_ready_reason') or 'unknown'})"
    rows.append(("upstream", f"{up.get('url', '–')} {state}"))
    req = data.get("requests") or {}
    by = ", ".join(f"{k}: {n(v)}" for k, v in sorted((req.get("by_status") or {}).items()))
    rows.append(("requests", f"{n(req.get('total', 0))}" + (f" ({by})" if by else "")))
    sess = data.get("sessions")
    if sess:
        busy = sum(1 for t in sess.get("table") or () if t.get("busy"))
        rows.append(("turns", f"hit {n(sess.get('hits', 0))} · restored {n(sess.get('restored', 0))} · miss "
                              f"{n(sess.get('misses', 0))}"))
        rows.append(("slots", f"{n(sess.get('slots', 0))} ({busy} busy), {n(sess.get('queued', 0))} requests "
                              "waiting"))
        rows.append(("snapshots", f"{n(sess.get('snapshots', 0))}, {sess.get('snapshot_bytes', 0) / 1e6:,.1f} MB "
                                  "on disk"))
        cluster = sess.get("cluster")
        if cluster:
            rows.append(("node", f"{cluster.get('node')} of {n(cluster.get('nodes_alive', 0))} alive; forwarded "
                                 f"out {n(cluster.get('forwarded_out', 0))}, in {n(cluster.get('forwarded_in', 0))}"))
    comp = data.get("pflash")
    if comp:
        modes = " · ".join(f"{m} {n(c)}" for m, c in sorted((comp.get("modes") or {}).items())) or "no turns yet"
        rows.append(("compression", f"{modes} (scorer {comp.get('scorer')}, threshold {n(comp.get('threshold'))} "
                                    "tokens)"))
    saved = data.get("savings")
    if saved:
        rows.append(("long messages", f"{n(saved.get('message_tokens', 0))} tokens → "
                                      f"{n(saved.get('message_served_tokens', 0))} served"))
        rows.append(("prefill", f"{n(saved.get('prefilled_tokens', 0))} tokens prefilled in "
                                f"{secs(saved.get('prefill_s'))}; {n(saved.get('cached_tokens', 0))} reused from "
                                "the slots"))
        avoided, seconds = saved.get("tokens_avoided") or {}, saved.get("seconds_saved") or {}
        total = sum(seconds.values()) if seconds else None
        rows.append(("time saved", f"≈ {secs(total)} (compression {secs(seconds.get('compression'))} for "
                                   f"{n(avoided.get('compression', 0))} tokens, cache {secs(seconds.get('cache'))} "
                                   f"for {n(avoided.get('cache', 0))} tokens; an estimate at the prefill rate "
                                   "llama-server reported)"))
    width = max(len(k) for k, _ in rows)
    lines = [f"pflash-proxy at {base}"] + [f"  {k:<{width}}  {v}" for k, v in rows]
    lines.append("(`pflash-proxy stats --json` for every counter; `pflash-proxy show` for the sessions)")
    return "\n".join(lines)


def cmd_warm(args: argparse.Namespace, settings: Settings) -> int:
    """Read FILE into the server as a conversation's system message, then snapshot it to SSD.

    Any later conversation that starts with the same system message continues that session: its first
    question restores or reuses the document instead of prefilling it.
    """
    base = _proxy_url(args, settings)
    try:
        text = Path(args.file).read_text(errors="replace")
    except OSError as exc:
        print(f"pflash-proxy warm: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    messages = [{"role": "system", "content": text}]
    if args.question:
        messages.append({"role": "user", "content": args.question})
    t0 = time.monotonic()
    try:
        out = _http("POST", base + "/v1/chat/completions", {"messages": messages, "max_tokens": 1})
        saved = _http("POST", base + "/pflash/save", {})
    except urllib.error.HTTPError as exc:
        print(f"pflash-proxy warm: the proxy at {base} answered {exc.code} {exc.reason}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as exc:
        print(unreachable("warm", base, exc), file=sys.stderr)
        return 1
    timings = out.get("timings", {})
    print(f"warmed {args.file}: {timings.get('prompt_n', '?')} tokens read in {time.monotonic() - t0:.1f}s; "
          f"{saved.get('saved', 0)} snapshot(s) written. Start conversations with this file as the system message.")
    return 0


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"
