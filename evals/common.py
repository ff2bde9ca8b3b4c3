"""What the ``ruler-qa``, ``code-tasks``, ``planted`` and ``every-x`` evals share.

1. ``Harness``: one llama-server (spawned as ``--spawn`` does, gemma by default; or ``--upstream``) whose
   tokenizer gives every count the proxy uses, and one in-process proxy per scorer (``runner.Proxy``: the product's
   stages; scorers built by ``code_reads.run.build`` from the settings ``serve`` would get: ``lexical``, the
   embedded default, and ``auto`` with ``--drafter``). The last stage is a ``Recorder``: it keeps, per
   ``X-Bench-Id``, the conversation as the proxy hands it on (chat messages, any dialect) with the request's log
   fields. By default it stops the request there (nothing is prefilled: the body the proxy would forward is
   what is checked). With ``--forward`` the request goes on to llama-server (one output token) through a ``Tap``
   in front of it that keeps the body of each request carrying an ``X-Bench-Id`` (the proxy passes client
   headers on): what llama-server actually received is what is checked. A follow-up turn goes through the same
   proxy session (a ``X-PFlash-Session`` name per case), as ``bench quality``'s multi-turn cases do.
2. ``send(...)``: one request through one proxy; returns a ``Sent`` (mode, reason, tokens in / kept, and the
   text llama-server received or would receive: every string of the forwarded body).
3. ``split_of(key)``: ``held-out`` for about 40 % of keys (the first byte of SHA-256 of the key below 102),
   else ``dev``; stable across machines and versions.
4. ``write(out, name, data, tables, notes, command)``: ``NAME.json`` (the run), ``NAME.md`` (notes + tables),
   printed and listed on stderr by the caller.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shlex
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp

from aiohttp import web

from evals.code_reads.run import commit as commit  # the checkout's HEAD, named in each report
from pflash_proxy.bench.report import Table, markdown_table
from pflash_proxy.bench.runner import BENCH_HEADER, DryRun, LlamaProc, Proxy, new_id
from pflash_proxy.contract import ProxyRequest, Stage
from pflash_proxy.jsontypes import JSONObject, JSONValue
from pflash_proxy.models import message_text

if TYPE_CHECKING:
    from pflash_proxy.config import Settings
    from pflash_proxy.stages.scorers import Scoring

# held-out-2: every-x and code-tasks; held-out-3 and held-out-4: code-tasks
SPLITS = ("dev", "held-out", "held-out-2", "held-out-3", "held-out-4")
HELD_OUT_BELOW = 102  # of 256: about 40 % held out


def new_session() -> str:
    """A fresh proxy session name part (one per case)."""
    return new_id()


def split_of(key: str) -> str:
    """Step 3: ``held-out`` or ``dev`` by a hash of ``key`` (a package, an article title, a wording)."""
    return "held-out" if hashlib.sha256(key.strip().lower().encode()).digest()[0] < HELD_OUT_BELOW else "dev"


def strings(value: JSONValue) -> list[str]:
    """Every string in a JSON value, depth first (keys left out): the text a forwarded body carries."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings(v)]
    return []


@dataclass
class Seen:
    messages: list[JSONObject]  # the conversation as the proxy hands it on (chat messages)
    fields: JSONObject  # the request's log fields


class Recorder(Stage):
    """Last stage: the conversation as the proxy hands it on, per ``X-Bench-Id``, any dialect; stops the request
    there unless ``forward``."""

    name = "evals-recorder"

    def __init__(self, forward: bool = False) -> None:
        self.forward = forward
        self.seen: dict[str, Seen] = {}

    async def on_request(self, req: ProxyRequest) -> None:
        key = req.headers.get(BENCH_HEADER)
        if key:
            self.seen[key] = Seen([dict(m) for m in req.messages], dict(req.log_fields))
        if not self.forward:
            raise DryRun("dry run: not forwarded")


# RFC 7230 hop-by-hop headers and the ones aiohttp computes itself: not passed through the tap
_HOP = frozenset(("connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                  "trailers", "transfer-encoding", "upgrade", "host", "content-length"))


def _end_to_end(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _HOP}


class Tap:
    """In front of llama-server (``--forward``): passes every request and answer through unchanged, streaming,
    and keeps the JSON body of each POST carrying an ``X-Bench-Id``: what llama-server received."""

    def __init__(self, target: str):
        self.target = target.rstrip("/")
        self.received: dict[str, JSONValue] = {}
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        from pflash_proxy.llama.spawn import free_port

        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._relay)
        self._http = aiohttp.ClientSession(auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None))
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._http is not None:
            await self._http.close()

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        assert self._http is not None
        body = await request.read()
        key = request.headers.get(BENCH_HEADER)
        if key and request.method == "POST" and body:
            try:
                self.received[key] = json.loads(body)
            except ValueError:
                self.received[key] = body.decode("utf-8", "replace")
        async with self._http.request(request.method, self.target + request.path_qs, data=body or None,
                                      headers=_end_to_end(request.headers), allow_redirects=False) as r:
            resp = web.StreamResponse(status=r.status, headers=_end_to_end(r.headers))
            await resp.prepare(request)
            async for chunk in r.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp


@dataclass
class Sent:
    """One request through one proxy: what llama-server received (or would have) and how the proxy served it."""

    status: int
    mode: str
    reason: str | None
    tokens_in: int | None
    tokens_kept: int | None
    messages: list[JSONObject] = field(default_factory=list)  # as the proxy handed them on (chat messages)
    fields: JSONObject = field(default_factory=dict)
    seconds: float = 0.0
    received: JSONValue = None  # --forward: the body llama-server received

    @property
    def kept(self) -> float:
        """The compressed message's served tokens over its tokens (llama-server's counts); 1.0 when served whole."""
        if self.mode != "compressed" or not self.tokens_in or self.tokens_kept is None:
            return 1.0
        return round(self.tokens_kept / self.tokens_in, 4)

    @property
    def checked_in(self) -> str:
        """Where the text that is checked comes from: ``llama-server`` (the body it received) or ``proxy`` (the
        conversation the proxy would forward)."""
        return "llama-server" if self.received is not None else "proxy"

    @property
    def text(self) -> str:
        """What the model reads: every string of the body llama-server received (``--forward``), else every
        message's text as the proxy handed it on, joined by newlines."""
        if self.received is not None:
            return "\n".join(strings(self.received))
        return "\n".join(message_text(m.get("content")) for m in self.messages)


def _int(value: JSONValue) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class Harness:
    """Step 1: ``async with Harness(opts, ctx_per_slot) as h``: ``h.proxies`` (scorer → proxy, recorder),
    ``h.unavailable`` (scorer → why not), ``h.http`` (a client session), ``h.llama_url``."""

    def __init__(self, opts: argparse.Namespace, ctx_per_slot: int = 8192):
        self.opts = opts
        self.work = Path(opts.workdir)
        self.forward = bool(getattr(opts, "forward", False))
        # forwarded prompts must fit a slot (gemma-3-270m caps a slot at 32K whatever is asked)
        self.llama = LlamaProc(self.work / "llama", opts.upstream, opts.model,
                               ctx_per_slot=max(ctx_per_slot, 32768) if self.forward else ctx_per_slot, parallel=2)
        self.tap: Tap | None = None
        self.proxies: dict[str, tuple[Proxy, Recorder]] = {}
        self.unavailable: dict[str, str] = {}
        self._built: dict[str, str | tuple[Settings, Scoring | None]] = {}
        self.http: aiohttp.ClientSession | None = None

    @property
    def llama_url(self) -> str:
        return self.llama.url

    async def __aenter__(self) -> "Harness":
        from evals.code_reads.run import build

        await self.llama.start()
        try:
            upstream = self.llama.url
            if self.forward:
                self.tap = Tap(self.llama.url)
                await self.tap.start()
                upstream = self.tap.url
            self._built = build(self.opts.scorers, self.opts, upstream, self.work, self.llama.slot_dir)
            self.unavailable = {k: v for k, v in self._built.items() if isinstance(v, str)}
            for name, v in self._built.items():
                if isinstance(v, str):
                    continue
                settings, scoring = v
                proxy = Proxy(settings, scorer=scoring.scorer if scoring is not None else None,
                              dry_run=not self.forward)
                recorder = Recorder(forward=self.forward)
                proxy.recorder = recorder  # type: ignore[assignment]  # any dialect: the conversation as handed on
                self.proxies[name] = (await proxy.__aenter__(), recorder)
            read_s = getattr(self.opts, "drafter_timeout", 1800.0) + 600
            self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=read_s))
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.http is not None:
            await self.http.close()
        for proxy, _ in self.proxies.values():
            await proxy.__aexit__(None, None, None)
        for v in self._built.values():
            if not isinstance(v, str) and v[1] is not None:
                v[1].close()
        if self.tap is not None:
            await self.tap.stop()
        await self.llama.stop()

    async def count(self, text: str) -> int:
        """llama-server's token count of ``text`` (``llama.direct.tokenize_counter``)."""
        from pflash_proxy.llama.direct import tokenize_counter

        assert self.http is not None
        return await tokenize_counter(self.http, self.llama.url)(text)

    async def send(self, scorer: str, route: str, body: JSONObject, headers: dict[str, str] | None = None
                   ) -> Sent:
        """Step 2: one request through ``scorer``'s proxy (stopped before the forward unless ``--forward``)."""
        assert self.http is not None
        proxy, recorder = self.proxies[scorer]
        bench_id = new_id()
        t0 = time.perf_counter()
        async with self.http.post(proxy.url + route, json=body,
                                  headers={**(headers or {}), BENCH_HEADER: bench_id}) as r:
            await r.read()
            status, h = r.status, dict(r.headers)
        seen = recorder.seen.pop(bench_id, None)
        received = self.tap.received.pop(bench_id, None) if self.tap is not None else None
        fields: JSONObject = seen.fields if seen is not None else {}
        mode = h.get("X-PFlash-Mode", "?")
        tokens_in = _int(fields.get("tokens_in"))
        kept = _int(fields.get("tokens_kept")) if mode == "compressed" else tokens_in
        reason = fields.get("pflash_reason") or ("below the threshold" if mode == "passthrough" else None)
        return Sent(status, mode, str(reason) if reason is not None else None, tokens_in, kept,
                    seen.messages if seen is not None else [], fields, round(time.perf_counter() - t0, 3),
                    received)

    async def chat(self, scorer: str, messages: Sequence[JSONObject], session: str) -> Sent:
        """``send`` on the chat route, one named proxy session per case (``X-PFlash-Session``)."""
        body: JSONObject = {"model": "gemma", "messages": list(messages), "max_tokens": 1, "temperature": 0}
        return await self.send(scorer, "/v1/chat/completions", body, {"X-PFlash-Session": session})


# ----------------------------------------------------------------------------------------------- options


def scorers_of(opts: argparse.Namespace) -> list[str]:
    """``--scorers`` as a list; by default the embedded default (``lexical``), plus with ``--drafter`` the drafter's
    scorer: ``auto`` for documents (ruler-qa, planted), ``head-attention`` for code (code-tasks, every-x: ``auto``
    scores code with ``lexical``, no drafter pass)."""
    code = getattr(opts, "kind", "") in ("code-tasks", "every-x")
    raw = opts.scorers or (("lexical,head-attention" if code else "lexical,auto") if getattr(opts, "drafter", None)
                           else "lexical")
    return [s for s in raw.split(",") if s] if isinstance(raw, str) else list(raw)


def command_of(kind: str, opts: argparse.Namespace, extra: Sequence[str] = ()) -> str:
    """The command line that repeats this run (the options that matter, defaults spelled out)."""
    argv = ["python", "-m", "evals", kind, "--split", opts.split, "--seed", str(opts.seed), "--threshold",
            str(opts.threshold), "--scorers", ",".join(opts.scorers), *extra]
    if getattr(opts, "limit", 0):
        argv += ["--limit", str(opts.limit)]
    if getattr(opts, "drafter", None):
        argv += ["--drafter", str(opts.drafter)]
    if getattr(opts, "upstream", None):
        argv += ["--upstream", str(opts.upstream)]
    if getattr(opts, "forward", False):
        argv.append("--forward")
    return shlex.join(argv + ["--out", str(opts.out)])




# ----------------------------------------------------------------------------------------------- report


def objects(value: JSONValue) -> list[JSONObject]:
    """The JSON objects of a JSON list (a run's records or cases as read back)."""
    return [x for x in value if isinstance(x, dict)] if isinstance(value, list) else []


def reason_key(mode: JSONValue, reason: JSONValue) -> str:
    """``mode: reason`` with its numbers as N, so the same cause from different cases counts once."""
    return f"{mode}: {re.sub(r'[0-9]+', 'N', str(reason or ''))[:90]}"


def pct(k: int, n: int) -> str:
    return f"{k}/{n} ({100 * k / n:.0f}%)" if n else "–"


def median(xs: Sequence[float]) -> float | None:
    return round(statistics.median(xs), 3) if xs else None


def write(out: Path, name: str, title: str, data: JSONObject, tables: Sequence[Table], notes: Sequence[str]
          ) -> tuple[str, list[Path]]:
    """Step 4: ``NAME.json`` and ``NAME.md`` in ``out``; returns the markdown and the paths."""
    out.mkdir(parents=True, exist_ok=True)
    md = "\n".join([f"# {title}", ""] + [f"- {n}" for n in notes] + [""] + [markdown_table(t) for t in tables])
    paths = [out / f"{name}.md", out / f"{name}.json"]
    paths[0].write_text(md)
    paths[1].write_text(json.dumps(data, indent=1, ensure_ascii=False))
    return md, paths
