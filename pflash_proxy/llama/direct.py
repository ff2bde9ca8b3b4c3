"""llama-server driven directly, without the proxy, by the benches that measure against it (``bench/``).

1. ``tokenize_counter``: a text's tokens as llama-server counts them (``POST /tokenize``), so cases are sized in
   the measured model's own tokens;
2. ``erase_slot``: empty a slot (``POST /slots/{id}?action=erase``), so a direct run starts cold;
3. ``pinned``: the fields that send a direct request to one slot (``id_slot``).
Each takes the bench's own ``aiohttp`` session and the server's URL; an error status raises
``aiohttp.ClientResponseError``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import aiohttp

from pflash_proxy.llama.engine import SLOT_FIELD

CountAsync = Callable[[str], Awaitable[int]]


def tokenize_counter(http: aiohttp.ClientSession, llama_url: str) -> CountAsync:
    """Step 1."""
    async def count(text: str) -> int:
        async with http.post(llama_url + "/tokenize", json={"content": text}) as r:
            r.raise_for_status()
            return len((await r.json())["tokens"])

    return count


async def erase_slot(http: aiohttp.ClientSession, llama_url: str, slot: int) -> None:
    """Step 2."""
    async with http.post(f"{llama_url}/slots/{int(slot)}?action=erase") as r:
        await r.read()


def pinned(slot: int) -> dict[str, int]:
    """Step 3."""
    return {SLOT_FIELD: slot}
