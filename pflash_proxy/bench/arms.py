"""The shared set-up of ``bench ttft`` and ``bench answers``: one llama-server, two proxies in front of it.

1. Pick the first available scorer of ``--scorers`` (lexical when none is).
2. Start llama-server (or attach to ``--upstream``) with room for the longest case; cases are sized with its
   ``/tokenize`` and capped at what one slot holds (``cap``).
3. One HTTP client and two in-process proxies on the same server: PFlash on and PFlash off.
4. On exit, stop what was started, whatever happened.
"""

from __future__ import annotations

import argparse
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator

import aiohttp

from pflash_proxy.bench.quality import build_scorers
from pflash_proxy.bench.runner import LlamaProc, Proxy, bench_settings
from pflash_proxy.bench.sizing import ROOM, CountAsync, tokenize_counter


@dataclass
class Arms:
    llama: LlamaProc
    http: aiohttp.ClientSession
    pflash: Proxy
    full: Proxy
    scorer_name: str
    count: CountAsync  # llama-server's /tokenize: cases are sized in the upstream's own tokens
    cap: int  # the longest case that still fits one slot with its reply


@asynccontextmanager
async def two_arms(opts: argparse.Namespace, ctx_factor: float) -> AsyncIterator[Arms]:
    scorers = {k: v for k, v in build_scorers(opts.scorers, opts).items() if not isinstance(v, str)}
    scorer_name, scorer = next(iter(scorers.items()), ("lexical", None))
    work = Path(opts.workdir)
    llama = LlamaProc(work / "llama", opts.upstream, opts.model,
                      ctx_per_slot=int(max(opts.lengths) * ctx_factor) + 2048)
    await llama.start()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=1800)) as http:
            common = dict(threshold=opts.threshold, upstream_timeout_s=1800)
            async with Proxy(bench_settings(llama.url, work / "pflash", llama.slot_dir, **common),
                             scorer=scorer) as pf, \
                    Proxy(bench_settings(llama.url, work / "full", llama.slot_dir, pflash=False, **common)) as full:
                yield Arms(llama, http, pf, full, scorer_name, tokenize_counter(http, llama.url),
                           await llama.slot_ctx() - ROOM)
    finally:
        await llama.stop()
