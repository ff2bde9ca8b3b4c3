"""The index's fast key encoding (``local.KeyDisk``): the very bytes diskcache writes, so old indexes stay readable."""

from __future__ import annotations

import pickle
import pickletools
import random

import diskcache

from pflash_proxy.sessions.identity import message_hash
from pflash_proxy.sessions.index.local import KeyDisk, SessionStore, _tuple_key


def test_fast_key_bytes_are_diskcaches_own():
    rnd = random.Random(7)
    alphabet = "abcdef0123456789 é中😀\n\"'\\"
    keys = [("chain", "a" * 64), ("session", "b" * 32), ("salt",), ("x", "y", "z"), ("",), ("a" * 255,), ("", ""),
            ("x", "x"), ("x", "y", "x")]
    keys += [tuple("".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 80))) for _ in range(rnd.randint(1, 3)))
             for _ in range(3000)]
    checked = 0
    for key in keys:
        fast = _tuple_key(key)
        if fast is not None:
            checked += 1
            assert fast == pickletools.optimize(pickle.dumps(key, protocol=5)), key
    assert checked > 2500
    # what the fast path leaves to diskcache: other shapes, long or unencodable strings
    for key in [("a" * 256,), ("a", "b", "c", "d"), (), ("a", 1), ("\ud800",), ["chain", "x"]]:
        assert _tuple_key(key) is None if isinstance(key, tuple) else True


def test_an_index_written_without_the_fast_path_reads_the_same(tmp_path):
    plain = diskcache.Cache(str(tmp_path / "idx"))  # diskcache's own key encoding, as older releases wrote
    plain.set(("chain", "c" * 64), "sid-1")
    plain.close()
    store = SessionStore(tmp_path / "idx")
    assert isinstance(store.cache.disk, KeyDisk)
    assert store.cache.get(("chain", "c" * 64)) == "sid-1"
    rec = store.new_session("seed", False)
    msgs = [{"role": "user", "content": "hello"}]
    store.save_session(rec, [message_hash(m) for m in msgs], msgs)
    found, matched, _ = store.lookup("seed", msgs)
    assert found is not None and found.id == rec.id and matched == 1
    store.close()
    again = diskcache.Cache(str(tmp_path / "idx"))  # and what the fast path wrote, diskcache reads as its own
    assert ("session", rec.id) in again
    assert again.get(("chain", "c" * 64)) == "sid-1"
    again.close()


def test_a_save_runs_no_expiry_scan(tmp_path):
    store = SessionStore(tmp_path / "idx")
    statements: list[str] = []
    store.cache._con.set_trace_callback(statements.append)
    rec = store.new_session("seed", False)
    msgs = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    store.save_session(rec, [message_hash(m) for m in msgs], msgs)
    assert any("INSERT" in s for s in statements)
    assert not [s for s in statements if "expire_time <" in s], "nothing in the index expires"
