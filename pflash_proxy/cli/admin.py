"""Admin commands: ``ls``, ``rm``, ``stats``, ``warm``.

``ls``/``rm`` read the snapshot index directly (diskcache is safe to share with a running proxy; a shared
``--index redis://`` is read the same way, and ``ls`` then names each session's node and the live nodes);
``stats``/``warm`` talk to the running proxy over HTTP.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from pflash_proxy.config import Settings


def run(args: argparse.Namespace, settings: Settings) -> int:
    return {"ls": cmd_ls, "rm": cmd_rm, "stats": cmd_stats, "warm": cmd_warm}[args.command](args, settings)


def _store_and_snapshots(settings: Settings):
    from pflash_proxy.llama.upstream import Upstream
    from pflash_proxy.sessions.index import open_index
    from pflash_proxy.sessions.snapshots import SnapshotManager

    store = open_index(settings.home, settings.index)
    return store, SnapshotManager(store, Upstream(None), settings.effective_slot_save_path, 0)


def cmd_ls(args: argparse.Namespace, settings: Settings) -> int:
    from pflash_proxy.sessions.index import is_cluster

    store, _ = _store_and_snapshots(settings)
    snaps = sorted(store.snapshots(), key=lambda r: -r.last_use)
    # a shared index (--index redis://) also says which node holds each session and which nodes are alive
    holders: dict[str, str] = store.holders() if is_cluster(store) else {}
    nodes: dict[str, str] = store.nodes() if is_cluster(store) else {}
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
    return (getattr(args, "url", None) or settings.local_url).rstrip("/")


def _http(method: str, url: str, payload: dict | None = None, timeout: float = 3600) -> dict:
    data = json.dumps(payload).encode() if payload is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read() or b"{}")


def cmd_stats(args: argparse.Namespace, settings: Settings) -> int:
    url = _proxy_url(args, settings) + "/pflash/stats"
    try:
        data = _http("GET", url, timeout=10)
    except (urllib.error.URLError, OSError) as exc:
        print(f"pflash-proxy stats: cannot reach {url}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(data, indent=2))
    return 0


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
    except (urllib.error.URLError, OSError) as exc:
        print(f"pflash-proxy warm: {exc}", file=sys.stderr)
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
