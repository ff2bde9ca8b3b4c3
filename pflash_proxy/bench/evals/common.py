"""What the ``ruler-qa``, ``code-tasks``, ``planted`` and ``every-x`` evals share.

1. ``Harness``: one llama-server (spawned as ``--spawn`` does, gemma by default; or ``--upstream``) whose
   tokenizer gives every count the proxy uses, and one in-process proxy per scorer (``runner.Proxy``: the product's
   stages; scorers built by ``code_reads.run.build`` from the settings ``serve`` would get: ``lexical``, the
   embedded default, and ``auto`` with ``--drafter``). The last stage is ``code_reads.run.Recorder``: it keeps,
   per ``X-Bench-Id``, the conversation exactly as the proxy hands it to llama-server (chat messages, any
   dialect) with the request's log fields, and stops the request there, so nothing is prefilled. A follow-up
   turn goes through the same proxy session (a ``X-PFlash-Session`` name per case), as ``bench quality``'s
   multi-turn cases do.
2. ``send(...)``: one request through one proxy; returns a ``Sent`` (mode, reason, tokens in / kept, served text).
3. ``split_of(key)``: ``held-out`` for about 40 % of keys (the first byte of SHA-256 of the key below 102),
   else ``dev``; stable across machines and versions.
4. ``write(out, name, data, tables, notes, command)``: ``NAME.json`` (the run), ``NAME.md`` (notes + tables),
   printed and listed on stderr by the caller.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import statistics
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp

from pflash_proxy.bench.report import Table, markdown_table
from pflash_proxy.bench.runner import BENCH_HEADER, LlamaProc, Proxy, new_id
from pflash_proxy.jsontypes import JSONObject, JSONValue
from pflash_proxy.models import message_text

if TYPE_CHECKING:
    from pflash_proxy.bench.code_reads.run import Recorder
    from pflash_proxy.config import Settings
    from pflash_proxy.stages.scorers import Scoring

SPLITS = ("dev", "held-out")
HELD_OUT_BELOW = 102  # of 256: about 40 % held out


def new_session() -> str:
    """A fresh proxy session name part (one per case)."""
    return new_id()


def split_of(key: str) -> str:
    """Step 3: ``held-out`` or ``dev`` by a hash of ``key`` (a package, an article title, a wording)."""
    return "held-out" if hashlib.sha256(key.strip().lower().encode()).digest()[0] < HELD_OUT_BELOW else "dev"


@dataclass
class Sent:
    """One request through one proxy: what llama-server would have received and how the proxy served it."""

    status: int
    mode: str
    reason: str | None
    tokens_in: int | None
    tokens_kept: int | None
    messages: list[JSONObject] = field(default_factory=list)  # as forwarded (chat messages)
    fields: JSONObject = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def kept(self) -> float:
        """The compressed message's served tokens over its tokens (llama-server's counts); 1.0 when served whole."""
        if self.mode != "compressed" or not self.tokens_in or self.tokens_kept is None:
            return 1.0
        return round(self.tokens_kept / self.tokens_in, 4)

    @property
    def text(self) -> str:
        """Every forwarded message's text, joined: what the model reads."""
        return "\n".join(message_text(m.get("content")) for m in self.messages)


def _int(value: JSONValue) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class Harness:
    """Step 1: ``async with Harness(opts, ctx_per_slot) as h``: ``h.proxies`` (scorer → proxy, recorder),
    ``h.unavailable`` (scorer → why not), ``h.http`` (a client session), ``h.llama_url``."""

    def __init__(self, opts: argparse.Namespace, ctx_per_slot: int = 8192):
        self.opts = opts
        self.work = Path(opts.workdir)
        self.llama = LlamaProc(self.work / "llama", opts.upstream, opts.model, ctx_per_slot=ctx_per_slot,
                               parallel=2)
        self.proxies: dict[str, tuple[Proxy, Recorder]] = {}
        self.unavailable: dict[str, str] = {}
        self._built: dict[str, str | tuple[Settings, Scoring | None]] = {}
        self.http: aiohttp.ClientSession | None = None

    @property
    def llama_url(self) -> str:
        return self.llama.url

    async def __aenter__(self) -> "Harness":
        from pflash_proxy.bench.code_reads.run import Recorder, build

        await self.llama.start()
        try:
            self._built = build(self.opts.scorers, self.opts, self.llama.url, self.work, self.llama.slot_dir)
            self.unavailable = {k: v for k, v in self._built.items() if isinstance(v, str)}
            for name, v in self._built.items():
                if isinstance(v, str):
                    continue
                settings, scoring = v
                proxy = Proxy(settings, scorer=scoring.scorer if scoring is not None else None, dry_run=True)
                recorder = Recorder()
                proxy.recorder = recorder  # type: ignore[assignment]  # any dialect: the conversation as forwarded
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
        await self.llama.stop()

    async def count(self, text: str) -> int:
        """llama-server's token count of ``text`` (``/tokenize``)."""
        assert self.http is not None
        async with self.http.post(self.llama.url + "/tokenize", json={"content": text}) as r:
            data = await r.json()
        return len(data["tokens"])

    async def send(self, scorer: str, route: str, body: JSONObject, headers: dict[str, str] | None = None
                   ) -> Sent:
        """Step 2: one request through ``scorer``'s proxy, stopped before the forward."""
        assert self.http is not None
        proxy, recorder = self.proxies[scorer]
        bench_id = new_id()
        t0 = time.perf_counter()
        async with self.http.post(proxy.url + route, json=body,
                                  headers={**(headers or {}), BENCH_HEADER: bench_id}) as r:
            await r.read()
            status, h = r.status, dict(r.headers)
        seen = recorder.seen.pop(bench_id, None)
        fields: JSONObject = seen.fields if seen is not None else {}
        mode = h.get("X-PFlash-Mode", "?")
        tokens_in = _int(fields.get("tokens_in"))
        kept = _int(fields.get("tokens_kept")) if mode == "compressed" else tokens_in
        reason = fields.get("pflash_reason") or ("below the threshold" if mode == "passthrough" else None)
        return Sent(status, mode, str(reason) if reason is not None else None, tokens_in, kept,
                    seen.messages if seen is not None else [], fields, round(time.perf_counter() - t0, 3))

    async def chat(self, scorer: str, messages: Sequence[JSONObject], session: str) -> Sent:
        """``send`` on the chat route, one named proxy session per case (``X-PFlash-Session``)."""
        body: JSONObject = {"model": "gemma", "messages": list(messages), "max_tokens": 1, "temperature": 0}
        return await self.send(scorer, "/v1/chat/completions", body, {"X-PFlash-Session": session})


# ----------------------------------------------------------------------------------------------- options


def scorers_of(opts: argparse.Namespace) -> list[str]:
    """``--scorers`` as a list; by default the embedded default (``lexical``), plus ``auto`` with ``--drafter``."""
    raw = opts.scorers or ("lexical,auto" if getattr(opts, "drafter", None) else "lexical")
    return [s for s in raw.split(",") if s] if isinstance(raw, str) else list(raw)


def command_of(kind: str, opts: argparse.Namespace, extra: Sequence[str] = ()) -> str:
    """The command line that repeats this run (the options that matter, defaults spelled out)."""
    argv = ["pflash-proxy", "bench", kind, "--split", opts.split, "--seed", str(opts.seed), "--threshold",
            str(opts.threshold), "--scorers", ",".join(opts.scorers), *extra]
    if getattr(opts, "limit", 0):
        argv += ["--limit", str(opts.limit)]
    if getattr(opts, "drafter", None):
        argv += ["--drafter", str(opts.drafter)]
    if getattr(opts, "upstream", None):
        argv += ["--upstream", str(opts.upstream)]
    return shlex.join(argv + ["--out", str(opts.out)])


def commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


# ----------------------------------------------------------------------------------------------- report


def objects(value: JSONValue) -> list[JSONObject]:
    """The JSON objects of a JSON list (a run's records or cases as read back)."""
    return [x for x in value if isinstance(x, dict)] if isinstance(value, list) else []


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
