"""The ``SessionIndex`` contract on both backends: the embedded one (``sqlite.py``) and the shared one (``redis.py``)
against a real ``redis-server`` the test starts itself.

1. The same ``SessionIndex`` contract on each (each test runs on both): records with their chain entries,
   the longest-prefix lookup, forks, pruning, responses, snapshot records.
2. Two nodes (two clients) see each other's writes and share one salt.
3. What only a cluster has: the turn lease is atomic (of many concurrent takers exactly one wins), only its
   holder renews or frees it, and it expires; heartbeats expire; a holder claim is compare-and-set.
4. A Redis that is gone raises ``StoreError`` (served without the index, never a failed request).
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from pflash_proxy.sessions.index import SessionIndex, SnapshotRecord, StoreError, TraceLog, open_index
from pflash_proxy.sessions.index.codec import encode
from pflash_proxy.sessions.index.redis import RedisIndex
from pflash_proxy.sessions.index.sqlite import SqliteIndex
from tests.redis_server import RedisServer, binary

needs_redis = pytest.mark.skipif(binary() is None, reason="redis-server not installed (scripts/setup.sh)")


@pytest.fixture
def redis_server(tmp_path):
    if binary() is None:
        pytest.skip("redis-server not installed (scripts/setup.sh)")
    server = RedisServer.start(tmp_path / "redis")
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=needs_redis)])
def index(request, tmp_path):
    if request.param == "sqlite":
        idx: SessionIndex = open_index(tmp_path, request.param)
        assert isinstance(idx, SqliteIndex) and idx.as_cluster() is None and not idx.remote
    else:
        server = RedisServer.start(tmp_path / "redis")
        request.addfinalizer(server.stop)
        idx = open_index(tmp_path, server.url)
        assert isinstance(idx, RedisIndex) and idx.as_cluster() is idx and idx.remote
    yield idx
    idx.close()


def msgs(*texts: str) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(texts)]


def test_lookup_finds_the_longest_served_prefix_and_forks_keep_their_parent(index):
    rec = index.new_session("seed", True, owner="o")
    served = msgs("hello", "hi", "more")
    _, _, hashes = index.lookup("seed", served)
    index.save_session(rec, hashes, served)
    found, matched, _ = index.lookup("seed", msgs("hello", "hi", "more", "answer", "next"))
    assert found is not None and found.id == rec.id and matched == 3 and found.turns == 1
    assert found.served == served and found.owner == "o"
    assert index.lookup("other seed", served)[0] is None  # namespaces never meet
    found2, matched2, _ = index.lookup("seed", msgs("hello", "hi", "different"))
    assert found2 is not None and found2.id == rec.id and matched2 == 2  # a fork point
    fork = index.new_session("seed", True, parent=found2, upto=2, owner="o")
    assert fork.served == served[:2] and fork.id != rec.id
    found2.traces.append({"kind": "recall"})
    found2.trace_totals["recalls"] = 1
    index.update_record(found2)
    again = index.get(rec.id)
    assert again is not None and again.traces == [{"kind": "recall"}] and again.trace_totals == {"recalls": 1}
    assert index.count_sessions() == 1 and set(index.last_uses()) == {rec.id}
    assert [r.id for r in index.sessions()] == [rec.id]


def _chain_writes(index) -> list[str]:
    """Count the chain entries the index writes from now on (SQLite rows / Redis ``MSET`` keys)."""
    written: list[str] = []
    if isinstance(index, SqliteIndex):
        inner_conn = index._conn

        class Counted:
            def __init__(self, conn):
                self.conn = conn

            def executemany(self, sql, rows):
                rows = list(rows)
                if "INTO chain" in sql:
                    written.extend(h for h, _ in rows)
                return self.conn.executemany(sql, rows)

            def __getattr__(self, name):
                return getattr(self.conn, name)
        index._conn = lambda: Counted(inner_conn())
    else:
        inner_pipeline = index.r.pipeline

        def pipeline(*args, **kwargs):
            pipe = inner_pipeline(*args, **kwargs)
            mset = pipe.mset

            def counted(mapping):
                written.extend(k for k in mapping if "chain:" in k)
                return mset(mapping)
            pipe.mset = counted
            return pipe
        index.r.pipeline = pipeline
    return written


def test_a_later_turn_writes_the_chain_entries_of_its_new_messages_only(index):
    """A conversation of 40 messages that grows by two per turn writes two chain entries a turn, not 40; the
    lookups stay what they were, also after a fork took the shared prefix over and when the parent goes on."""
    history = msgs(*(f"message {i}" for i in range(40)))
    rec = index.new_session("seed", False, owner="o")
    index.save_session(rec, index.lookup("seed", history)[2], history)
    written = _chain_writes(index)
    longer = history + [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    found, matched, hashes = index.lookup("seed", longer)
    assert found is not None and found.id == rec.id and matched == 40
    index.save_session(found, hashes, longer)
    assert len(written) == 2  # the two new messages' entries; the 40 before were written by the first save
    # a fork at message 20 takes the shared prefix over (a new session writes every prefix)
    parent, at, fork_hashes = index.lookup("seed", history[:20] + [{"role": "user", "content": "other"}])
    assert parent is not None and parent.id == rec.id and at == 20
    fork = index.new_session("seed", False, parent=parent, upto=20, owner="o")
    index.save_session(fork, fork_hashes, history[:20] + [{"role": "user", "content": "other"}])
    assert len(written) == 2 + 21
    # the parent goes on: it is found by its own newest entries, and writes only its new ones
    again, matched, hashes = index.lookup("seed", longer + [{"role": "user", "content": "next"}])
    assert again is not None and again.id == rec.id and matched == 42
    index.save_session(again, hashes, longer + [{"role": "user", "content": "next"}])
    assert len(written) == 2 + 21 + 1
    # a request that diverges inside the shared prefix finds a session holding that very prefix
    either, at, _ = index.lookup("seed", history[:10] + [{"role": "user", "content": "elsewhere"}])
    assert either is not None and either.id in (rec.id, fork.id) and at == 10
    assert either.served[:10] == history[:10]
    assert index.lookup("seed", longer + [{"role": "user", "content": "next"}])[0].id == rec.id
    assert index.lookup("seed", history[:20] + [{"role": "user", "content": "other"}])[0].id == fork.id


def _recall_source(word: str):
    """A real recall source: what compressing a document leaves for later questions."""
    from pflash_proxy.compress import CompressionSettings, Compressor, RequestFinder, TokenizedText
    from pflash_proxy.compress.scores import LexicalScorer

    text = "\n".join(f"Line {i} of the {word} ledger notes a shipment of {i * 7} crates to dock {i % 13}."
                      for i in range(400)) + "\n"
    tt = TokenizedText.from_text(text)
    request = RequestFinder().find([{"role": "user", "content": text + f"Which dock got 700 {word} crates?"}], 0, tt)
    out = Compressor(CompressionSettings(threshold=100), scorer=LexicalScorer()).compress(
        tt, request, tt.total_tokens + 50, True, "paste", "1")
    assert out.recall is not None
    return out.recall


def _stored_values(index) -> dict[str, bytes]:
    """Every stored value by key name (``session:<id>``, ``recall:<key>`` ...), whatever the backend."""
    if isinstance(index, SqliteIndex):
        c = index._conn()
        out = {f"session:{sid}": data for sid, data in c.execute("SELECT sid, data FROM session")}
        out |= {f"served:{sid}:{pos}": data for sid, pos, data in c.execute("SELECT sid, pos, data FROM served")}
        out |= {f"recall:{key}": data for key, data in c.execute("SELECT key, data FROM recall")}
        out |= {f"traces:{sid}": data for sid, data in c.execute("SELECT sid, data FROM traces")}
        out |= {f"trace-part:{sid}:{key}": data for sid, key, data in c.execute("SELECT sid, key, data FROM trace_part")}
        return out
    return {k.decode()[len(index.p):]: index.r.get(k) for k in index.r.keys(f"{index.p}*")
            if index.r.type(k) == b"string"}


def _store_record(index, sid: str, data: bytes) -> None:
    """Put a record's bytes in the index as they are (one an older version, or damage, wrote), as a process
    other than this one would: the embedded index's lookup mirror does not hold what it did not write or read."""
    if isinstance(index, SqliteIndex):
        index._conn().execute("INSERT OR REPLACE INTO session VALUES (?, ?, ?)", (sid, time.time(), data))
    else:
        index.r.set(f"{index.p}session:{sid}", data)


def _reopen(index) -> str:
    """What ``open_index`` takes to open another client of ``index``'s store (a restart, another process)."""
    return index.url if isinstance(index, RedisIndex) else "sqlite"


def test_recall_sources_are_written_once_under_their_own_keys(index, tmp_path):
    """A session that compressed two documents: each recall source is written once, at the turn that made it,
    and no later turn's record carries it; the lookup gives them back in order (also to a fresh index, as
    after a restart), records written with inline sources are read and move them to keys at their next save, and
    pruning removes them with their session."""
    first, second = _recall_source("amber"), _recall_source("cobalt")
    rec = index.new_session("seed", False, owner="o")
    served = msgs("paste one", "ok")
    rec.recall_sources = [first]
    index.save_session(rec, index.lookup("seed", served)[2], served)
    values = _stored_values(index)
    recall_keys = {k for k in values if k.startswith("recall:")}
    assert len(recall_keys) == 1 and len(rec.recall_keys) == 1
    assert b"omitted_texts" not in values[f"session:{rec.id}"]  # the record names the source, never holds it
    found, matched, hashes = index.lookup("seed", served + msgs("paste two"))
    assert found is not None and matched == 2 and found.recall_sources == [first]
    found.recall_sources = [*found.recall_sources, second]  # the compression stage's append
    before = {k: v for k, v in _stored_values(index).items() if k.startswith("recall:")}
    index.save_session(found, hashes, served + msgs("paste two"))
    after = {k: v for k, v in _stored_values(index).items() if k.startswith("recall:")}
    assert len(after) == 2 and all(after[k] == v for k, v in before.items())  # the first one untouched
    for _ in range(3):  # later turns write no source again
        again, _, hashes = index.lookup("seed", served + msgs("paste two", "q"))
        assert again is not None and again.recall_sources == [first, second]
        index.save_session(again, hashes, served + msgs("paste two", "q"))
    assert {k: v for k, v in _stored_values(index).items() if k.startswith("recall:")} == after
    # a fresh index object reads them back from the store (its cache is empty)
    fresh = open_index(tmp_path, _reopen(index))
    try:
        back, _, _ = fresh.lookup("seed", served + msgs("paste two", "q"))
        assert back is not None and [s.omitted_texts for s in back.recall_sources] == \
            [first.omitted_texts, second.omitted_texts]
    finally:
        fresh.close()
    # a record written before the keys held its sources inline: read as they were, moved to keys at its save
    legacy = index.new_session("other seed", False)
    legacy.recall_sources = [first]
    legacy.recall_stored = 0
    inline = encode("session", legacy)  # nothing stored under keys yet: the sources go inline
    assert b"omitted_texts" in inline
    _store_record(index, legacy.id, inline)
    old = index.get(legacy.id)
    assert old is not None and [s.omitted_texts for s in old.recall_sources] == [first.omitted_texts]
    index.save_session(old, ["h"], msgs("legacy"))
    assert len(old.recall_keys) == 1 and b"omitted_texts" not in _stored_values(index)[f"session:{legacy.id}"]
    # pruned with its session
    index.prune(older_than=None, max_sessions=0)
    assert not any(k.startswith("recall:") for k in _stored_values(index))


def test_served_messages_are_written_once_under_their_session_and_position(index, tmp_path):
    """A long conversation's turn writes its new served messages, not its history again: the record holds no
    message, a fresh index (a restart) reads the history back in order, a record written with its history inline
    is read and moves it to keys at its next save, a history with a message gone is read as absent (a cold
    prefill, never a wrong replay), and pruning removes the messages."""
    history = msgs(*(f"message {i} " + "x" * 500 for i in range(40)))
    rec = index.new_session("seed", False)
    index.save_session(rec, index.lookup("seed", history)[2], history)
    served_keys = lambda: {k for k in _stored_values(index) if k.startswith("served:")}  # noqa: E731
    assert len(served_keys()) == 40
    assert b"message 3 " not in _stored_values(index)[f"session:{rec.id}"]
    before = {k: v for k, v in _stored_values(index).items() if k.startswith("served:")}
    longer = history + [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    found, matched, hashes = index.lookup("seed", longer)
    assert found is not None and matched == 40 and found.served == history
    index.save_session(found, hashes, longer)
    after = {k: v for k, v in _stored_values(index).items() if k.startswith("served:")}
    assert len(after) == 42 and all(after[k] == v for k, v in before.items())
    fresh = open_index(tmp_path, _reopen(index))
    try:
        back = fresh.get(rec.id)
        assert back is not None and back.served == longer and back.turns == 2
        # a message gone: the history cannot be replayed, the session reads as absent
        if isinstance(fresh, SqliteIndex):
            fresh._conn().execute("DELETE FROM served WHERE sid = ? AND pos = 7", (rec.id,))
        else:
            fresh.r.delete(f"{fresh.p}served:{rec.id}:7")
        reader = open_index(tmp_path, _reopen(index))  # nothing cached
        try:
            assert reader.get(rec.id) is None and reader.lookup("seed", longer)[0] is None
        finally:
            reader.close()
    finally:
        fresh.close()
    # a record written before the keys held its history inline: read as it was, moved to keys at its save
    legacy = index.new_session("other seed", False)
    legacy.served = msgs("old one", "old two")
    inline = encode("session", legacy)
    assert b"old one" in inline
    _store_record(index, legacy.id, inline)
    old = index.get(legacy.id)
    assert old is not None and old.served == msgs("old one", "old two")
    index.save_session(old, ["h1", "h2", "h3"], msgs("old one", "old two", "new"))
    assert b"old one" not in _stored_values(index)[f"session:{legacy.id}"]
    assert index.get(legacy.id).served == msgs("old one", "old two", "new")
    index.prune(older_than=None, max_sessions=0)
    assert not served_keys()


def test_a_record_without_the_served_versions_of_its_messages_is_not_continued(index):
    """A record whose served history is shorter than its hashes (damaged, or written by a version that kept its
    messages elsewhere) is not a match at that length: replaying it would drop the request's first messages."""
    history = msgs("one", "two", "three")
    rec = index.new_session("seed", False)
    index.save_session(rec, index.lookup("seed", history)[2], history)
    short = index.get(rec.id)
    short.served = short.served[:1]
    short.served_stored = short.served_keyed = 1
    _store_record(index, rec.id, encode("session", short))
    found, matched, _ = index.lookup("seed", history + msgs("four"))
    assert found is None or matched <= len(found.served)
    assert matched == 1 and found.id == rec.id  # the one message it holds the served version of


def test_prune_forgets_old_and_surplus_sessions_with_their_chain_and_responses(index):
    ids = []
    for i in range(4):
        rec = index.new_session("seed", False)
        served = msgs(f"conversation {i}")
        index.save_session(rec, index.lookup("seed", served)[2], served)
        ids.append(rec.id)
        time.sleep(0.01)
    assert index.put_response("resp-0", {"session": ids[0], "items": [1]})
    assert not index.put_response("resp-x", {"session": "no such session"})
    assert index.last_response(ids[0]) == "resp-0" and index.response("resp-0") == {"session": ids[0], "items": [1]}
    gone = index.prune(older_than=None, max_sessions=2, keep={ids[1]})
    assert gone == [ids[0], ids[2]]
    assert index.get(ids[0]) is None and index.response("resp-0") is None
    assert index.lookup("seed", msgs("conversation 0"))[0] is None
    assert index.lookup("seed", msgs("conversation 3"))[0].id == ids[3]
    assert index.count_sessions() == 2


def test_a_sessions_trace_log_is_its_own_key_updated_atomically_and_pruned_with_it(index):
    """The inspector's traces live apart from the record (which every turn reads): an update reads, changes and
    writes the log in one transaction, counts as a use, writes nothing for a session that is gone, and the log
    goes with its session."""
    rec = index.new_session("seed", False)
    index.save_session(rec, ["h"], msgs("hello"))
    assert index.trace_log(rec.id) is None
    assert index.update_trace_log("f" * 32, lambda kept: TraceLog([{"kind": "turn"}])) is None  # no such session
    assert index.trace_log("f" * 32) is None
    used = index.last_uses()[rec.id]

    def one_more(kept: TraceLog) -> TraceLog:
        return TraceLog(kept.traces + [{"kind": "turn", "turn": len(kept.traces) + 1}],
                        {"turns": kept.totals.get("turns", 0) + 1})

    threads = [threading.Thread(target=index.update_trace_log, args=(rec.id, one_more)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = index.trace_log(rec.id)
    assert got is not None and [t["turn"] for t in got.traces] == list(range(1, 9)) and got.totals == {"turns": 8}
    assert index.last_uses()[rec.id] >= used
    assert index.get(rec.id).traces == []  # the record carries none of it
    assert index.prune(older_than=None, max_sessions=0) == [rec.id]
    assert index.trace_log(rec.id) is None


def test_a_traces_text_and_units_are_written_once_under_keys_of_their_own(index, monkeypatch):
    """A compressed document's trace keeps its original text and its units: the trace write that adds the trace
    writes each once, under a key of its own, and every later write of the session's log carries the log's small
    fields only; a reader gets each in place. A text the log drops (``MAX_TEXT_CHARS``) takes its key with it and
    keeps its units, a trace it drops (``MAX_TRACES``) takes both, a prune takes them all, and a log written with
    its texts inline (before) is read as it is and moves them to keys at its next write."""
    from pflash_proxy.sessions import traces as trace_module
    from pflash_proxy.sessions.traces import TurnTraces, append

    monkeypatch.setattr(trace_module, "MAX_TRACES", 3)
    monkeypatch.setattr(trace_module, "MAX_TEXT_CHARS", 25_000)
    rec = index.new_session("seed", False)
    index.save_session(rec, ["h"], msgs("hello"))
    documents = [f"document {i}: " + "line of the pasted file\n" * 500 for i in range(5)]  # ~12K chars each

    def units(i: int) -> dict:
        return {"start": list(range(i, i + 50)), "end": list(range(i + 1, i + 51)), "tokens": [7] * 50,
                "score": [0.25] * 50}

    def add(turn: int, *documents_: str) -> None:
        traces = TurnTraces(turn)
        for i, text in enumerate(documents_):
            traces.add({"v": 2, "kind": "compression", "turn": turn, "message": i, "text": text,
                        "units": units(turn)}, {"compressed": 1})
        traces.add({"v": 2, "kind": "turn", "turn": turn})
        assert index.update_trace_log(rec.id, lambda kept: append(kept, traces)) is not None

    def stored() -> tuple[dict, dict[str, bytes]]:  # the session's log and its parts, as stored
        values = _stored_values(index)
        log = json.loads(values[f"traces:{rec.id}"])["value"]
        return log, {k: v for k, v in values.items() if k.startswith(f"trace-part:{rec.id}:")}

    def compressions() -> list[tuple[str | None, dict | None]]:
        got = index.trace_log(rec.id)
        assert got is not None and all(not k.endswith("_key") and k != "text_chars" for t in got.traces for k in t)
        return [(t.get("text"), t.get("units")) for t in got.traces if t["kind"] == "compression"]

    add(1, documents[0])
    log, parts = stored()
    assert len(parts) == 2 and b"line of the pasted file" not in json.dumps(log).encode()
    [compression] = [t for t in log["traces"] if t["kind"] == "compression"]
    assert compression["text_chars"] == len(documents[0]) and "text" not in compression and "units" not in compression
    assert set(parts) == {f"trace-part:{rec.id}:{compression[k]}" for k in ("text_key", "units_key")}
    for turn in (2, 3):  # turns without a document: nothing is written again
        add(turn)
        assert stored()[1] == parts
    assert compressions() == [(documents[0], units(1))]

    add(4, documents[1])  # two texts, ~24K chars: both kept
    add(5, documents[2])  # a third: the oldest loses its text (and its key), keeps its units
    assert compressions() == [(None, units(1)), (documents[1], units(4)), (documents[2], units(5))]
    assert len(stored()[1]) == 5
    add(6, documents[3])  # MAX_TRACES 3: the first trace goes with its units, the second loses its text
    assert compressions() == [(None, units(4)), (documents[2], units(5)), (documents[3], units(6))]
    assert len(stored()[1]) == 5

    # another session's log written before, its text inline: read as it is, moved to a key at its next write
    rec = index.new_session("other seed", False)
    index.save_session(rec, ["h2"], msgs("hi"))
    old = TraceLog([{"v": 2, "kind": "compression", "turn": 1, "message": 0, "text": documents[4]}], {})
    if isinstance(index, SqliteIndex):
        index._conn().execute("INSERT OR REPLACE INTO traces VALUES (?, ?)", (rec.id, encode("traces", old)))
    else:
        index.r.set(f"{index.p}traces:{rec.id}", encode("traces", old))
    assert compressions() == [(documents[4], None)] and not stored()[1]
    add(2)
    log, parts = stored()
    assert len(parts) == 1 and all("text" not in t for t in log["traces"] if t["kind"] == "compression")
    assert compressions() == [(documents[4], None)]
    assert len(stored_parts(index)) == 6  # the first session's five, this one's

    index.prune(older_than=None, max_sessions=0)
    assert not stored_parts(index)


def stored_parts(index) -> list[str]:
    return [k for k in _stored_values(index) if k.startswith("trace-part:")]


def _add_document_trace(index, sid: str, turn: int) -> TraceLog | None:
    from pflash_proxy.sessions.traces import TurnTraces, append

    traces = TurnTraces(turn)
    traces.add({"v": 2, "kind": "compression", "turn": turn, "message": 0, "text": f"document {turn}",
                "units": {"spans": [[0, 1]]}})
    return index.update_trace_log(sid, lambda kept: append(kept, traces))


def test_a_trace_write_landing_inside_a_prune_leaves_no_part_behind(index, monkeypatch):
    """A prune lists what a session's keys are, then deletes them; a trace write that lands in between (it runs
    after the answer, in a worker thread or on another node) adds parts the prune did not list: they must go too,
    never stay behind without a log that names them."""
    from pflash_proxy.sessions.index import redis as redis_index, sqlite as sqlite_index

    rec = index.new_session("seed", False)
    index.save_session(rec, ["h"], msgs("hello"))
    assert _add_document_trace(index, rec.id, 1) is not None
    assert len(stored_parts(index)) == 2
    landed: list[TraceLog | None] = []

    def write_once() -> None:
        if not landed:
            landed.append(None)  # before the write: the write reads the log too
            landed[0] = _add_document_trace(index, rec.id, 2)

    if isinstance(index, SqliteIndex):  # between the ranking and the victim's transaction
        victims = sqlite_index.prune_victims
        monkeypatch.setattr(sqlite_index, "prune_victims", lambda *a: (victims(*a), write_once())[0])
    else:  # between the read of the log and the transaction that deletes
        read = redis_index.stored_trace_log
        monkeypatch.setattr(redis_index, "stored_trace_log", lambda *a: (read(*a), write_once())[0])
    assert index.prune(older_than=None, max_sessions=0) == [rec.id]
    assert landed and landed[0] is not None  # the write did land, with its parts
    assert index.trace_log(rec.id) is None and not stored_parts(index)


@needs_redis
def test_a_prune_landing_inside_a_trace_write_leaves_no_log_behind(tmp_path):
    """The other order, across nodes: a trace write has checked that its session exists and is about to write
    the session's first log when another node prunes the session; the write must not land."""
    server = RedisServer.start(tmp_path / "redis")
    try:
        a, b = open_index(tmp_path / "a", server.url), open_index(tmp_path / "b", server.url)
        rec = a.new_session("seed", False)
        a.save_session(rec, ["h"], msgs("hello"))
        from pflash_proxy.sessions.traces import TurnTraces, append

        traces = TurnTraces(1)
        traces.add({"v": 2, "kind": "compression", "turn": 1, "message": 0, "text": "document"})
        pruned = []

        def update(kept: TraceLog) -> TraceLog:
            if not pruned:
                pruned.append(b.prune(older_than=None, max_sessions=0))
            return append(kept, traces)

        assert a.update_trace_log(rec.id, update) is None
        assert pruned == [[rec.id]]
        assert a.trace_log(rec.id) is None and not stored_parts(a)
        a.close()
        b.close()
    finally:
        server.stop()


def test_a_trace_text_gone_or_damaged_reads_as_dropped(index, caplog):
    """A text key that is gone or holds something other than a trace-part record costs that trace its text
    (logged), never the log or the other traces' texts."""
    from pflash_proxy.sessions.traces import TurnTraces, append

    rec = index.new_session("seed", False)
    index.save_session(rec, ["h"], msgs("hello"))
    traces = TurnTraces(1)
    for i in range(3):
        traces.add({"v": 2, "kind": "compression", "turn": 1, "message": i, "text": f"text {i}"})
    index.update_trace_log(rec.id, lambda kept: append(kept, traces))
    keys = sorted(k for k in _stored_values(index) if k.startswith("trace-part:"))
    by_message = {json.loads(_stored_values(index)[k])["value"]: k for k in keys}
    gone, damaged = by_message["text 0"], by_message["text 1"]
    if isinstance(index, SqliteIndex):
        c = index._conn()
        c.execute("DELETE FROM trace_part WHERE sid = ? AND key = ?", gone.split(":")[1:])
        c.execute("UPDATE trace_part SET data = ? WHERE sid = ? AND key = ?", (b"\x80\x04not json", *damaged.split(":")[1:]))
    else:
        index.r.delete(index.p + gone)
        index.r.set(index.p + damaged, b"\x80\x04not json")
    got = index.trace_log(rec.id)
    assert got is not None
    assert [(t.get("text"), t.get("text_dropped")) for t in got.traces] == [(None, True), (None, True), ("text 2", None)]
    assert "gone" in caplog.text and "not a readable trace-part record" in caplog.text


def test_snapshot_records_round_trip(index):
    rec = SnapshotRecord(session="s1", file="pf-s1.bin", tokens=120, served_hashes=["a", "b"], model_identity="m",
                         size=4096, checksum="crc32:0000abcd")
    index.put_snapshot(rec)
    assert index.snapshot("s1") == rec and index.snapshots() == [rec]
    assert index.drop_snapshot("s1") == rec
    assert index.snapshot("s1") is None and index.snapshots() == [] and index.drop_snapshot("s1") is None


def test_two_nodes_share_records_and_salt(redis_server, tmp_path):
    a, b = RedisIndex(redis_server.url), RedisIndex(redis_server.url)
    assert a.salt and a.salt == b.salt
    rec = a.new_session("seed", False)
    served = msgs("shared")
    a.save_session(rec, a.lookup("seed", served)[2], served)
    seen = b.lookup("seed", msgs("shared", "answer"))[0]
    assert seen is not None and seen.id == rec.id
    assert b.claim(rec.id, "node-b", None) == "node-b" and a.holder(rec.id) == "node-b"
    assert a.claim(rec.id, "node-a", None) == "node-b"  # a saw no holder, but b claimed it meanwhile
    assert a.claim(rec.id, "node-a", "node-b") == "node-a" and b.holder(rec.id) == "node-a"
    assert a.holders() == {rec.id: "node-a"}
    a.close()
    b.close()


def test_the_turn_lease_is_atomic_owned_and_expires(redis_server):
    nodes = [RedisIndex(redis_server.url) for _ in range(4)]
    for round_ in range(20):
        sid = f"session-{round_}"
        won: list[str] = []
        start = threading.Barrier(len(nodes) * 2)

        def take(idx: RedisIndex, token: str) -> None:
            start.wait()
            if idx.acquire_turn(sid, token, 5000):
                won.append(token)
        threads = [threading.Thread(target=take, args=(n, f"n{i}/{j}")) for i, n in enumerate(nodes) for j in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(won) == 1, won
        other = next(f"n{i}/{j}" for i in range(4) for j in range(2) if f"n{i}/{j}" not in won)
        assert not nodes[1].release_turn(sid, other) and not nodes[1].renew_turn(sid, other, 5000)
        assert nodes[0].turn_holder(sid) == won[0]
        assert nodes[2].release_turn(sid, won[0]) and nodes[0].turn_holder(sid) is None
    a = nodes[0]
    assert a.acquire_turn("short", "x", 200) and not a.acquire_turn("short", "y", 200)
    assert a.renew_turn("short", "x", 600)
    time.sleep(0.3)
    assert not a.acquire_turn("short", "y", 200)  # renewed: still held
    time.sleep(0.5)
    assert a.acquire_turn("short", "y", 200)  # expired: free again
    for n in nodes:
        n.close()


def test_heartbeats_expire_and_a_leaving_node_is_gone_at_once(redis_server):
    idx = RedisIndex(redis_server.url)
    idx.heartbeat("n1", "http://127.0.0.1:1", 300)
    idx.heartbeat("n2", "http://127.0.0.1:2", 5000)
    assert idx.nodes() == {"n1": "http://127.0.0.1:1", "n2": "http://127.0.0.1:2"}
    time.sleep(0.45)
    assert idx.node_url("n1") is None and idx.node_url("n2") == "http://127.0.0.1:2"
    idx.leave("n2")
    assert idx.nodes() == {}
    idx.close()


@needs_redis
def test_a_redis_that_is_gone_raises_store_error(tmp_path):
    server = RedisServer.start(tmp_path / "redis")
    idx = RedisIndex(server.url, timeout_s=1)
    server.stop()
    for call in (lambda: idx.get("x"), lambda: idx.lookup("seed", msgs("a")), lambda: idx.acquire_turn("x", "t", 10),
                 lambda: idx.snapshots(), lambda: idx.heartbeat("n", "http://x", 10)):
        with pytest.raises(StoreError):
            call()
    with pytest.raises(StoreError):
        RedisIndex(server.url, timeout_s=1)


def test_ls_reads_the_shared_index_with_each_sessions_node(redis_server, capsys):
    from pflash_proxy.cli import main

    idx = RedisIndex(redis_server.url)
    idx.put_snapshot(SnapshotRecord(session="a" * 32, file="pf-a.bin", tokens=77, served_hashes=["h"],
                                    model_identity="m", size=2048))
    idx.claim("a" * 32, "gpu1", None)
    idx.heartbeat("gpu1", "http://10.0.0.11:8090", 5000)
    assert main(["ls", "--index", redis_server.url, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["session"] == "a" * 32 and row["tokens"] == 77 and row["node"] == "gpu1"
    assert main(["ls", "--index", redis_server.url]) == 0
    out = capsys.readouterr().out
    assert "gpu1" in out and "nodes alive: gpu1 (http://10.0.0.11:8090)" in out
    idx.close()


async def test_the_stats_list_a_shared_indexs_snapshots_in_a_worker_thread(redis_server, tmp_path):
    """/pflash/stats and every metrics scrape read the snapshot totals: with a shared index that is a listing of
    every node's records over the network, run at most every few seconds in a worker thread."""
    import asyncio

    from pflash_proxy.engine.fake import FakeEngine
    from pflash_proxy.sessions import snapshot_store as store_module
    from pflash_proxy.sessions.service import SessionService
    from tests.conftest import make_settings

    idx = RedisIndex(redis_server.url)
    for i in range(3):
        idx.put_snapshot(SnapshotRecord(session=f"{i}" * 32, file=f"pf-{i}.bin", tokens=10, served_hashes=[],
                                        model_identity="m", size=1000))
    mgr = SessionService(make_settings("http://127.0.0.1:9", tmp_path), FakeEngine(), index=idx)
    threads: list[bool] = []
    listing = idx.snapshots

    def spy():  # noted once listed: the stats take the listing up right after
        listed = listing()
        threads.append(threading.current_thread() is threading.main_thread())
        return listed
    idx.snapshots = spy
    assert mgr.stats().snapshots.snapshots == 0  # not listed yet: the listing has only started
    for _ in range(100):
        await asyncio.sleep(0.02)
        if mgr.stats().snapshots.snapshots == 3:
            break
    stats = mgr.stats().snapshots
    assert stats.snapshots == 3 and stats.snapshot_bytes == 3000
    assert threads == [False], threads  # one listing, in a worker thread; later stats reuse it for a while
    store_module.SNAPSHOT_TOTALS_S, old = 0.0, store_module.SNAPSHOT_TOTALS_S
    try:
        mgr.stats()
        for _ in range(100):
            await asyncio.sleep(0.02)
            if len(threads) == 2:
                break
        await asyncio.sleep(0.02)  # the second listing taken up before the index closes
        assert threads == [False, False]
    finally:
        store_module.SNAPSHOT_TOTALS_S = old
    idx.close()
