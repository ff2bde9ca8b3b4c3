"""Recorded Responses chains in the store, without sockets (sessions/chains.py)."""

from __future__ import annotations

from pflash_proxy.sessions.chains import expand, record
from pflash_proxy.sessions.identity import credential, message_hash, namespace_seed
from pflash_proxy.sessions.index.sqlite import SqliteIndex


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def answer(text: str) -> dict:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


def saved_session(store: SqliteIndex, owner: str | None = None):
    rec = store.new_session(namespace_seed("m", owner=owner), False, owner=owner)
    store.save_session(rec, [message_hash(user("hello"))], [user("hello")])
    return rec


def test_two_chains_in_one_session_expand_to_their_own_items(tmp_path):
    store = SqliteIndex(tmp_path / "s")
    sid = saved_session(store).id
    record(store, "rA1", sid, None, [user("hello"), answer("a1")], None)
    record(store, "rB1", sid, None, [user("hello"), user("B-PRIVATE"), answer("b1")], None)
    assert expand(store, "rA1", None) == [user("hello"), answer("a1")]
    record(store, "rA2", sid, None, [user("hello"), answer("a1"), user("next"), answer("a2")], ("rA1", 2))
    assert expand(store, "rA2", None) == [user("hello"), answer("a1"), user("next"), answer("a2")]
    assert store.response("rA2")["items"] == [user("next"), answer("a2")]  # the chain's items are stored once
    assert expand(store, "rB1", None) == [user("hello"), user("B-PRIVATE"), answer("b1")]
    store.close()


def test_a_client_that_resends_its_history_is_stored_as_a_delta(tmp_path):
    store = SqliteIndex(tmp_path / "s")
    sid = saved_session(store).id
    items = [user("hello"), answer("a1")]
    record(store, "r1", sid, None, items, None)
    for i in range(2, 6):
        items = items + [user(f"q{i}"), answer(f"a{i}")]
        record(store, f"r{i}", sid, None, items, None)
        assert store.response(f"r{i}")["items"] == items[-2:] and expand(store, f"r{i}", None) == items
    # a history that does not continue the last answer is stored whole
    other = [user("hello"), answer("changed"), user("q")]
    record(store, "rx", sid, None, other, None)
    assert store.response("rx")["parent"] is None and expand(store, "rx", None) == other
    store.close()


def test_an_id_is_unknown_to_another_credential(tmp_path):
    store = SqliteIndex(tmp_path / "s")
    alice = credential({"Authorization": "Bearer sk-alice"}, store.salt)
    assert alice == credential({"x-api-key": "sk-alice"}, store.salt) != credential({"x-api-key": "sk-bob"},
                                                                                    store.salt)
    assert credential({}, store.salt) is None and "sk-alice" not in alice
    sid = saved_session(store, alice).id
    record(store, "r1", sid, alice, [user("hello"), answer("a1")], None)
    assert expand(store, "r1", alice) == [user("hello"), answer("a1")]
    assert expand(store, "r1", None) is None and expand(store, "r1", "someone-else") is None
    store.close()


def test_responses_go_with_their_session(tmp_path):
    store = SqliteIndex(tmp_path / "s")
    sessions = [saved_session(store).id for _ in range(4)]
    for n, sid in enumerate(sessions):
        record(store, f"r{n}a", sid, None, [user("hello"), answer(f"{n}")], None)
        record(store, f"r{n}b", sid, None, [user("hello"), answer(f"{n}"), user("more"), answer("b")], (f"r{n}a", 2))
    assert store.prune(older_than=None, max_sessions=1, keep=frozenset()) == sessions[:3]
    rows = store._conn().execute("SELECT rid, sid FROM response ORDER BY rid").fetchall()
    assert rows == [("r3a", sessions[3]), ("r3b", sessions[3])]
    assert expand(store, "r3b", None) is not None
    store.close()


def test_an_entry_without_its_items_is_an_unknown_id_not_a_crash(tmp_path):
    store = SqliteIndex(tmp_path / "s")
    sid = saved_session(store).id
    store.put_response("r1", {"session": sid, "owner": None, "parent": None, "n": 1, "digest": "x"})
    assert expand(store, "r1", None) is None  # llama-server answers the id then (400), as for any unknown one
    store.close()
