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
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any, Iterable, Mapping

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


def message_hash(msg: Mapping[str, object]) -> str:
    blob = json.dumps(canonical_message(msg), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    # surrogatepass: a lone surrogate (a ``\ud800`` escape inside JSON a client sent as a string) hashes too
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


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
