"""Session identity: a hash chain over canonicalised chat messages.

1. Each message is canonicalised: role; content as a list of parts (a plain string becomes one text part);
   tool calls reduced to (id, type, function name, arguments); ``tool_call_id`` and ``name``.  Other fields
   (client bookkeeping such as timestamps) do not change identity.
2. ``h_0 = sha256(namespace)`` where the namespace is the upstream model's identity, the request's *owner*
   (``credential``: a salted hash of its ``Authorization`` / ``x-api-key`` / ``api-key`` values, when it sends
   any) and, for clients that name their session with ``X-PFlash-Session``, that name.
   ``h_i = sha256(h_{i-1} ‖ sha256(canonical(m_i)))``.
3. A request continues the session whose served history is the longest prefix of the request: the largest i
   with ``h_i`` in the index.  Because owner and explicit name are part of the seed, a session can only ever
   match its own credential (and name) AND the exact same messages: two API keys never share a session record,
   however their conversations begin, and naming a session never reads another's state.
4. The raw credential is never stored: only the HMAC-SHA256 of its values under the index's own random salt.
5. A message's hash is remembered (``MEMO``, an ``lru.ValueCache``) by its canonical form, frozen into tuples with each scalar's
   type beside it (``true`` and ``1`` stay apart), when its strings hold at least ``MEMO_MIN_CHARS``
   characters: every turn of a conversation sends its whole history again, and serialising it for the hash
   (``json.dumps``) costs ~3 ms per MB, where finding the frozen form in the memo costs a pass of Python's
   string hash and a comparison.  The memo keeps at most ``MEMO_MAX_BYTES`` bytes alive: each entry counts
   every object its frozen form holds (strings, numbers, the tuples of lists, dicts and scalars: what
   ``lru.footprint`` of the key gives, summed while freezing), so numbers, nesting and many small items count
   as much as they take; least recently used go first.  A message under ``MEMO_MIN_CHARS``, or one not kept, is
   hashed as in step 2, to the same value.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import sys
from typing import Any, Iterable, Mapping

from pflash_proxy.sessions.lru import ValueCache

CREDENTIAL_HEADERS = ("Authorization", "x-api-key", "api-key")


def _canonical_content(content: object) -> list[dict[str, object]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        parts: list[dict[str, Any]] = []
        for part in content:
            if isinstance(part, dict):
                kind = part.get("type", "text")
                if kind == "text":
                    parts.append({"type": "text", "text": part.get("text", "")})
                else:
                    parts.append({k: part[k] for k in sorted(part)})
            else:
                parts.append({"type": "text", "text": str(part)})
        # adjacent text parts render identically to their concatenation
        merged: list[dict[str, Any]] = []
        for p in parts:
            if merged and p.get("type") == "text" and merged[-1].get("type") == "text":
                merged[-1] = {"type": "text", "text": merged[-1]["text"] + p["text"]}
            else:
                merged.append(p)
        return merged
    return [{"type": "other", "value": content}]


def _canonical_tool_calls(calls: object) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for call in calls if isinstance(calls, list) else []:
        if not isinstance(call, dict):
            continue
        fn = call.get("function") or {}
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except (ValueError, RecursionError):  # not JSON, or nested too deeply to parse: hashed as the text
                pass
        out.append({"id": call.get("id"), "type": call.get("type", "function"), "name": fn.get("name"),
                    "arguments": args})
    return out


def canonical_message(msg: Mapping[str, object]) -> dict[str, object]:
    return {
        "role": msg.get("role"),
        "content": _canonical_content(msg.get("content")),
        "tool_calls": _canonical_tool_calls(msg.get("tool_calls")),
        "tool_call_id": msg.get("tool_call_id"),
        "name": msg.get("name"),
    }


MEMO_MIN_CHARS = 256  # a message with fewer characters in its strings is hashed directly (microseconds)
MEMO_MAX_BYTES = 32 * 2**20  # bytes the memo keeps alive, at most (its keys' objects, every one counted)
_TUPLE = sys.getsizeof(())  # a tuple's header; each item adds a pointer
_PTR = 8
_TYPE_NAMES: dict[type, str] = {t: t.__name__ for t in (int, float, bool, type(None))}  # ``type.__name__`` makes a new string each time


def _frozen(value: object, acc: list[int]) -> object:
    """``value`` (a canonical message: dicts, lists, JSON scalars) as nested tuples, equal exactly when the two
    values serialise to the same JSON; adds the characters of its strings to ``acc[0]`` and the bytes the frozen
    form keeps alive (``lru.footprint`` of it, computed on the way: every tuple, string and number) to
    ``acc[1]``."""
    if isinstance(value, str):
        acc[0] += len(value)
        acc[1] += sys.getsizeof(value)
        return value
    if isinstance(value, dict):
        items = sorted(value.items())
        out = ("d", *((k, _frozen(v, acc)) for k, v in items))
        # the outer tuple, each (key, value) pair and each key (a dict's keys are strings in JSON)
        acc[1] += _TUPLE + _PTR * len(out) + len(items) * (_TUPLE + 2 * _PTR)
        acc[1] += sum(sys.getsizeof(k) for k, _ in items)
        return out
    if isinstance(value, list):
        frozen = ("l", *(_frozen(v, acc) for v in value))
        acc[1] += _TUPLE + _PTR * len(frozen)
        return frozen
    acc[1] += _TUPLE + 2 * _PTR + sys.getsizeof(value)
    t = type(value)
    # True == 1 == 1.0 in Python, not in JSON: the type's name beside it (one string per type, not a new one each)
    return (_TYPE_NAMES.get(t) or sys.intern(t.__name__), value)


def _memo_key(canonical: dict[str, object], acc: list[int]) -> object:
    """``_frozen(canonical)`` by the shape ``canonical_message`` gives (its five fields in a fixed order, a text
    part as its string): the same equality, in a fifth of the time; the same counts in ``acc``."""
    content = canonical["content"]
    parts: list[object] = []
    for part in content if isinstance(content, list) else ():
        text = part.get("text") if isinstance(part, dict) and len(part) == 2 and part.get("type") == "text" else None
        if type(text) is str:
            acc[0] += len(text)
            acc[1] += sys.getsizeof(text)
            parts.append(text)
        else:
            parts.append(_frozen(part, acc))
    calls = canonical["tool_calls"]
    acc[1] += 2 * _TUPLE + _PTR * (5 + len(parts))  # the key and its parts' tuple
    return (_frozen(canonical["role"], acc), _frozen(canonical["tool_call_id"], acc),
            _frozen(canonical["name"], acc), tuple(parts), _frozen(calls, acc) if calls else ())


MEMO: ValueCache[str] = ValueCache(MEMO_MAX_BYTES)  # message hashes by frozen canonical message, sized in bytes
_DIGEST_BYTES = sys.getsizeof("0" * 64)  # a value: a hex digest


def _digest(canonical: dict[str, object]) -> str:
    blob = json.dumps(canonical, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    # surrogatepass: a lone surrogate (a ``\ud800`` escape inside JSON a client sent as a string) hashes too
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


def message_hash(msg: Mapping[str, object], memo: ValueCache[str] | None = MEMO) -> str:
    canonical = canonical_message(msg)
    content = msg.get("content")
    if memo is None or (isinstance(content, str) and len(content) < MEMO_MIN_CHARS and not msg.get("tool_calls")):
        return _digest(canonical)
    acc = [0, 0]  # characters of its strings, bytes of the frozen form
    try:
        key = _memo_key(canonical, acc)
    except RecursionError:  # arguments nested deeper than freezing reaches (json.dumps reaches further)
        return _digest(canonical)
    if acc[0] < MEMO_MIN_CHARS:
        return _digest(canonical)
    hash(key)  # the strings' hashes, computed (and kept on them) outside the memo's lock
    digest = memo.get(key)
    if digest is None:
        digest = _digest(canonical)
        memo.put(key, digest, acc[1] + _DIGEST_BYTES)
    return digest


def credential(headers: Mapping[str, str], salt: str) -> str | None:
    """Whom a request speaks for: the salted hash of its credential headers' values (a ``Bearer`` scheme dropped,
    so one key sent either way is one owner), or None when it sends none."""
    values: set[str] = set()
    for name in CREDENTIAL_HEADERS:
        getall = getattr(headers, "getall", None)
        for value in (getall(name, []) if getall is not None else [headers.get(name)]):
            if isinstance(value, str) and value.strip():
                value = value.strip()
                values.add(value[7:].strip() if value[:7].lower() == "bearer " else value)
    if not values:
        return None
    return hmac.new(salt.encode(), "\x00".join(sorted(values)).encode("utf-8", "surrogatepass"),
                    hashlib.sha256).hexdigest()[:32]


def namespace_seed(model_identity: str, explicit_name: str | None = None, owner: str | None = None) -> str:
    ns_fields: dict[str, str | None] = {"model": model_identity, "explicit": explicit_name}
    if owner is not None:  # requests without a credential keep the seeds they always had
        ns_fields["owner"] = owner
    ns = json.dumps(ns_fields, sort_keys=True)
    return hashlib.sha256(ns.encode()).hexdigest()


def chain(seed: str, message_hashes: Iterable[str]) -> list[str]:
    """``[h_1, ..., h_n]``: the chain value after each message."""
    out = []
    h = seed
    for mh in message_hashes:
        h = hashlib.sha256((h + mh).encode()).hexdigest()
        out.append(h)
    return out
