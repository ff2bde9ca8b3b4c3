"""The embedded index's lookup mirror (``local.Mirror``): a continued session is found without reading SQLite, and
the mirror answers every lookup as SQLite alone does, through saves, forks, record updates and prunes, and when a
write runs during a lookup."""

from __future__ import annotations

import random

from pflash_proxy.sessions.identity import message_hash
from pflash_proxy.sessions.index.local import SessionStore


def msgs(*texts: str) -> list[dict[str, object]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(texts)]


def save(store: SessionStore, rec, messages: list[dict[str, object]]) -> None:
    store.save_session(rec, [message_hash(m) for m in messages], messages)


def counting_reads(store: SessionStore, monkeypatch) -> list[tuple[str, ...]]:
    reads: list[tuple[str, ...]] = []
    real = store.cache.get

    def get(key, *a, **kw):
        reads.append(key)
        return real(key, *a, **kw)

    monkeypatch.setattr(store.cache, "get", get)
    return reads


def test_a_continued_session_is_found_without_reading_sqlite(tmp_path, monkeypatch):
    store = SessionStore(tmp_path / "idx")
    rec = store.new_session("seed", False)
    history = msgs("hello", "hi there", "what is 2+2?")
    save(store, rec, history)
    reads = counting_reads(store, monkeypatch)

    found, matched, _ = store.lookup("seed", history)  # the same turn again
    assert found is not None and found.id == rec.id and matched == 3 and found.served == history
    assert reads == []

    found, matched, _ = store.lookup("seed", history + msgs("4")[:1])  # a new message: only its entry is read
    assert found is not None and found.id == rec.id and matched == 3
    assert [k[0] for k in reads] == ["chain"]


def test_a_session_another_index_wrote_is_read_from_sqlite_then_mirrored(tmp_path, monkeypatch):
    writer = SessionStore(tmp_path / "idx")
    rec = writer.new_session("seed", False)
    history = msgs("hello", "hi there")
    save(writer, rec, history)
    reader = SessionStore(tmp_path / "idx")  # as after a restart: nothing mirrored
    reads = counting_reads(reader, monkeypatch)
    assert reader.lookup("seed", history)[0].id == rec.id
    assert {k[0] for k in reads} >= {"chain", "session"}
    reads.clear()
    assert reader.lookup("seed", history)[0].id == rec.id
    assert reads == []


def test_a_lookup_during_a_write_keeps_nothing_it_read(tmp_path, monkeypatch):
    """A write that begins while a lookup reads SQLite may change what it read: the mirror takes none of it (it
    would otherwise answer with the value from before that write for as long as it holds it)."""
    store = SessionStore(tmp_path / "idx")
    rec = store.new_session("seed", False)
    history = msgs("hello", "hi there")
    save(store, rec, history)
    reader = SessionStore(tmp_path / "idx")
    real = reader.read

    def read_during_a_write(key):
        reader._writing(+1)  # a save of this process, in a worker thread, begins ...
        try:
            return real(key)
        finally:
            reader._writing(-1)  # ... and ends while the lookup runs

    monkeypatch.setattr(reader, "read", read_during_a_write)
    assert reader.lookup("seed", history)[0].id == rec.id
    assert reader.mirror.get(("session", rec.id)) is None
    monkeypatch.setattr(reader, "read", real)
    assert reader.lookup("seed", history)[0].id == rec.id  # quiet now: it keeps what it read
    assert reader.mirror.get(("session", rec.id)) is not None


def _answer(store: SessionStore, seed: str, request: list[dict[str, object]]) -> tuple[object, ...]:
    found, matched, _ = store.lookup(seed, request)
    if found is None:
        return (None, matched)
    return (found.id, matched, found.turns, found.served, found.client_hashes, found.recall_keys)


def test_the_mirror_answers_every_lookup_as_sqlite_does(tmp_path):
    """Random conversations on one index (new ones, continued ones, forks that rewrite a shared opening, record
    updates, prunes down to a few sessions, a small mirror that evicts): after each step, every request of the run
    looked up through this index (its mirror) and through a fresh index on the same directory (SQLite alone) gets
    the same answer."""
    rnd = random.Random(7)
    store = SessionStore(tmp_path / "idx")
    store.mirror.size = 12  # small: the mirror evicts during the run
    seeds = ["seed-a", "seed-b"]
    histories: list[tuple[str, list[dict[str, object]]]] = []
    words = ["alpha", "beta", "gamma", "delta"]
    for step in range(220):
        op = rnd.random()
        if op < 0.3 or not histories:
            seed, request = rnd.choice(seeds), msgs(*rnd.choices(words, k=rnd.randint(1, 3)))
        elif op < 0.85:
            seed, history = rnd.choice(histories)
            cut = rnd.randint(1, len(history))  # a continuation, or a fork inside the history
            request = history[:cut] + msgs(*rnd.choices(words, k=rnd.randint(1, 2)))[: rnd.randint(0, 2)]
            request = request or history[:1]
        elif op < 0.93:
            victims = store.prune(older_than=None, max_sessions=rnd.randint(1, 4))
            assert all(store.mirror.get(("session", sid)) is None for sid in victims)
            seed, request = rnd.choice(histories)
        else:
            seed, request = rnd.choice(histories)
            found, matched, _ = store.lookup(seed, request)
            if found is not None:
                found.turns += 10  # a record written back with a change
                store.update_record(found)
        found, matched, hashes = store.lookup(seed, request)
        if found is None or matched < len(found.served):
            found = store.new_session(seed, False, parent=found, upto=matched)
        save(store, found, request)
        histories.append((seed, request))
        sqlite_only = SessionStore(tmp_path / "idx")
        for seed_, request_ in rnd.sample(histories, min(len(histories), 8)):
            assert _answer(store, seed_, request_) == _answer(sqlite_only, seed_, request_), step
        sqlite_only.close()


def test_a_continued_session_is_not_decoded_again_and_each_lookup_gets_its_own_record(tmp_path, monkeypatch):
    """The record a lookup finds in the mirror is not decoded again: the save kept what it wrote, and an index that
    did not write it decodes it once; every lookup gets a copy whose lists are its own, so what one turn changes in
    its record is not what the next lookup returns."""
    import pflash_proxy.sessions.index.local as store_module

    store = SessionStore(tmp_path / "idx")
    rec = store.new_session("seed", False)
    history = msgs("hello", "hi there", "what is 2+2?")
    save(store, rec, history)
    decodes: list[str] = []
    real = store_module.decode

    def counting(kind, data, what):
        decodes.append(kind)
        return real(kind, data, what)

    monkeypatch.setattr(store_module, "decode", counting)
    first, _, _ = store.lookup("seed", history)
    second, _, _ = store.lookup("seed", history)
    assert decodes.count("session") == 0
    assert first is not second and first == second and first.served == history
    first.client_hashes.append("x")
    first.served.append({"role": "assistant", "content": "4"})
    first.trace_totals["turns"] = 9
    third, _, _ = store.lookup("seed", history)
    assert third.client_hashes == second.client_hashes and third.served == history and third.trace_totals == {}

    save(store, second, history + msgs("", "4")[1:])  # saved again: the save keeps what it wrote, decoded
    decodes.clear()
    for _ in range(2):
        found, matched, _ = store.lookup("seed", history + msgs("", "4")[1:])
        assert found is not None and matched == 4 and found.turns == 2
    assert decodes.count("session") == 0
    assert found.served == history + msgs("", "4")[1:]

    other = SessionStore(tmp_path / "idx")  # another index on the same directory decodes what it reads, once
    decodes.clear()
    for _ in range(2):
        assert other.lookup("seed", history + msgs("", "4")[1:])[0].turns == 2
    assert decodes.count("session") == 1


def test_a_save_keeps_what_decoding_its_bytes_gives(tmp_path):
    """What a save keeps for the next lookup is the record decoding the stored bytes gives, recall sources and all:
    served messages and sources under keys of their own, none inline, none read back; after every save of a run of
    new, continued, forked and updated sessions."""
    from pflash_proxy.sessions.index.codec import decode
    from tests.sessions.test_redis_index import _recall_source

    rnd = random.Random(3)
    store = SessionStore(tmp_path / "idx")
    sources = [_recall_source("copper"), _recall_source("tin")]
    histories: list[list[dict[str, object]]] = []
    for step in range(60):
        if histories and rnd.random() < 0.7:
            history = rnd.choice(histories)
            request = history[: rnd.randint(1, len(history))] + msgs("more", "again")[: rnd.randint(0, 2)]
        else:
            request = msgs(*rnd.choices(["alpha", "beta", "gamma"], k=rnd.randint(1, 3)))
        found, matched, _ = store.lookup("seed", request)
        if found is None or matched < len(found.served):
            found = store.new_session("seed", False, parent=found, upto=matched)
        if rnd.random() < 0.3:
            found.recall_sources.append(rnd.choice(sources))
        save(store, found, request)
        if rnd.random() < 0.2:
            found.turns += 5
            store.update_record(found)
        histories.append(request)
        data, kept = store._decodes.get(found.id)
        assert data is store.mirror.get(("session", found.id))
        decoded = decode("session", data, "test")
        assert kept == decoded, step
        assert (kept.served, kept.recall_sources, kept.served_stored, kept.recall_stored) == ([], [], 0, 0)
        again, matched, _ = store.lookup("seed", request)
        assert again is not None and again.id == found.id and again.served == request
        assert again.recall_sources == found.recall_sources


def test_a_copy_of_a_record_owns_every_list_and_dict(tmp_path):
    """``_fresh`` copies each container field of a record (a field added as a list or dict is copied too)."""
    from pflash_proxy.sessions.index.local import _fresh

    rec = SessionStore(tmp_path / "idx").new_session("seed", False)
    containers = [k for k, v in vars(rec).items() if isinstance(v, (list, dict))]
    assert containers  # the record has some
    copy = _fresh(rec)
    assert copy == rec and type(copy) is type(rec)
    for name in containers:
        assert getattr(copy, name) == getattr(rec, name) and getattr(copy, name) is not getattr(rec, name), name
