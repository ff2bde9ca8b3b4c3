"""Command line: ``pflash-proxy serve|ls|rm|stats|warm|show|wrap|options|bench|train``.

``serve`` flags are generated from the groups of ``Settings`` (``config.OPTIONS``; ``serve --help`` shows one
section per group) so every option has exactly one name:
``--prefill-curve`` ↔ ``PFLASH_PREFILL_CURVE`` ↔ ``prefill_curve = ...`` in TOML (one flag has an alias:
``--snapshot-every-turn`` for ``--save-every-turn``), and one text: its help, the TOML example and the reference's
table are made from the settings model (``cli.options``; ``pflash-proxy options``).  Flags default to
"not given" so that only what the user typed overrides the environment and the file.  Anything after ``--``
goes to the spawned llama-server.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import typing
from typing import Any, Sequence

from pflash_proxy import __version__
from pflash_proxy.cli import options
from pflash_proxy.config import GROUPS, OPTIONS, ConfigError, Settings, format_host, load_settings, private_dir
from pflash_proxy.stages.scorers import SCORER_NAMES, DrafterSetupError, check_scorer, scorer_help

# serve --help, by concern: (title, what the group is about, its options), one per group of ``Settings``; every
# text comes from the settings model (``cli.options``), none is written here
SERVE_GROUPS: tuple[tuple[str, str, tuple[str, ...]], ...] = tuple(
    (model.title or group, " ".join((model.__doc__ or "").split()),
     tuple(o.name for o in OPTIONS.values() if o.group == group and o.name not in options.NOT_A_FLAG))
    for group, model in GROUPS.items())
_CHOICES: dict[str, tuple[str, ...]] = {"scorer": SCORER_NAMES}  # options whose values a registry above names


def option_help(name: str) -> str:
    """An option's ``serve --help`` text: its description and default (``cli.options``); ``--scorer``'s lists the
    scorer registry's entries, which sits above the settings."""
    return scorer_help() if name == "scorer" else options.option_help(name)


def _add_settings_flags(parser: argparse.ArgumentParser) -> None:
    for title, description, names in SERVE_GROUPS:
        group = parser.add_argument_group(title, description)
        for name in names:
            flag = "--" + name.replace("_", "-")
            flags = [flag, *options.ALIASES.get(name, ())]
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
        p.add_argument("--index", help="the session index: 'embedded' (SQLite; 'sqlite' too) or redis://HOST:PORT/DB (also PFLASH_INDEX)")
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
    options.add_parser(sub)
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
    if args.command == "options":
        return options.main(args)
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
                                     shared=settings.cluster.shared)
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
        import uvloop  # ~25 % less per-request overhead than the default loop (measured at 9fafc9b)

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
