"""The relay's SSE bookkeeping: whole events only reach the client, and the last event with timings is kept."""

from __future__ import annotations

from pflash_proxy.llama.engine import REPORT_MARKERS
from pflash_proxy.server.relay import _complete_events, _SSETail


def test_the_sse_tail_keeps_the_last_timings_event_whatever_the_chunking():
    events = [b'data: {"content":"a"}\n\n', b'data: {"content":"b","usage":{"n":1}}\n\n',
              b'data: {"content":"c"}\n\n', b'data: {"content":"","timings":{"cache_n":5}}\n\n',
              b'data: {"content":"d"}\n\n', b"data: [DONE]\n\n"]
    stream = b"".join(events)
    for size in (1, 7, 23, len(stream)):  # as relay feeds it: whole events only, the rest held back
        tail, held = _SSETail(REPORT_MARKERS), b""
        for i in range(0, len(stream), size):
            chunk, held = _complete_events(held + stream[i:i + size])
            tail.feed(chunk)
        assert held == b"" and tail.last == {"content": "", "timings": {"cache_n": 5}}, size
    tail = _SSETail(REPORT_MARKERS)
    for e in events[:3]:  # unfinished events are still gathered across feeds
        tail.feed(e[:10])
        tail.feed(e[10:])
    assert tail.last == {"content": "b", "usage": {"n": 1}}
