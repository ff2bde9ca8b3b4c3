"""The inspector's session page in a real headless Chromium after a compressed turn (issue 14).

Debian's ``chromium`` (``scripts/setup.sh`` installs it), driven by Playwright-for-Python's async API with
``executable_path``: Playwright never downloads a browser here. The page must show the budget and mode, a heat
strip per unit, the request span, and omitted units folded: the test expands one fold and checks that the
omitted lines become visible. The screenshot is kept under the test's tmp directory; with
``INSPECTOR_SCREENSHOTS=1`` it is also copied to ``benchmarks/results/inspector/`` (git-ignored).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from pflash_proxy.server.app import create_app
from tests.conftest import make_settings
from tests.stages.test_compress_real import CURVE, SAMPLING, document

pytestmark = pytest.mark.llama

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
REPORTED = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "inspector"
KEEP = bool(os.environ.get("INSPECTOR_SCREENSHOTS"))  # read at import: conftest clears PFLASH_* per test


@pytest.fixture
def browser_parts():
    if CHROMIUM is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium; scripts/setup.sh does it as root)")
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        pytest.skip("playwright is not installed (it is in the test extra: pip install -e '.[test]')")
    return async_playwright


async def test_session_page_folds_omitted_units_and_expands_them(aiohttp_client, llama_server, tmp_path,
                                                                 browser_parts):
    settings = make_settings(llama_server.url, tmp_path, slot_save_path=llama_server.slot_dir, threshold=1000,
                             prefill_curve=CURVE, query_pin=32)
    client = await aiohttp_client(create_app(settings))
    question = "What was the name of the silver eagle, the prize bird?"
    resp = await client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": document() + "\n\n" + question}], **SAMPLING})
    assert resp.status == 200 and resp.headers["X-PFlash-Mode"] == "compressed"
    sid = resp.headers["X-PFlash-Session"]
    data = await (await client.get(f"/pflash/api/sessions/{sid}")).json()
    served = data["messages"][0]["text"]
    base = str(client.make_url("")).rstrip("/")

    async with browser_parts() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                          args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
            await page.goto(f"{base}/pflash/ui/session/{sid}")
            await page.wait_for_selector(".unit.omitted details")

            meta = await page.locator(".trace-meta").first.inner_text()
            assert "compressed" in meta and "budget" in meta and "scorer lexical" in meta
            assert await page.locator(".line.req").count() >= 1  # the request span is marked
            assert question in await page.locator(".line.req .tx").all_inner_texts()
            strip = await page.locator(".unit .heat").first.evaluate("n => getComputedStyle(n).backgroundColor")
            assert strip.startswith("rgb")  # each unit's heat strip is coloured by its score
            assert await page.locator(".unit .heat").count() == len(data["traces"][0]["units"])

            fold = page.locator(".unit.omitted details").first
            summary = await fold.locator("summary").inner_text()
            assert "lines omitted (unit " in summary and "score " in summary
            hidden = fold.locator(".line .tx").filter(has_text="Section")
            text = await hidden.first.text_content()
            assert text and text in document() and text not in served  # truly omitted from what the model read
            assert not await hidden.first.is_visible()
            await fold.locator("summary").click()
            assert await fold.evaluate("d => d.open")
            assert await hidden.first.is_visible()
            await hidden.first.scroll_into_view_if_needed()

            shot = tmp_path / "inspector-session.png"
            await page.screenshot(path=str(shot))
            assert shot.stat().st_size > 10_000
            if KEEP:
                REPORTED.mkdir(parents=True, exist_ok=True)
                shutil.copy(shot, REPORTED / "test-session-fold.png")

            await page.goto(f"{base}/pflash/ui")
            await page.wait_for_selector(f"#sessions a[href='/pflash/ui/session/{sid}']")
            assert errors == []
        finally:
            await browser.close()
