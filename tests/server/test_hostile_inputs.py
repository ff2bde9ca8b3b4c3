"""Inputs a client can send that used to end in a 500, each checked where it is handled (no llama-server needed;
the same bodies through the proxy in front of the real server are in ``test_hostile_json_real.py``).

1. Tool-call ``arguments`` (a JSON string inside the JSON body) that decode to a lone surrogate or nest ~1,000
   levels: the session identity hashes them without failing, and the dialect check refuses both (400).
2. ``GET /pflash/ui/static/<300 characters>.js``: a file name too long for the file system is a 404, not a 500.
"""

from __future__ import annotations

import pytest

from pflash_proxy.dialects import MAX_DEPTH, check_tool_arguments
from pflash_proxy.errors import BadRequest
from pflash_proxy.server.app import create_app
from pflash_proxy.sessions.identity import message_hash
from tests.conftest import make_settings


def _call(arguments: str) -> dict:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}]}


SURROGATE = '{"path": "\\ud800"}'  # what the client's JSON string holds: a \ud800 escape, parsed by the proxy
DEEP = "[" * 1200 + "]" * 1200


@pytest.mark.parametrize("arguments", [SURROGATE, '"\\udfff\\ud800x"', DEEP, "[" * 50_000])
def test_hashing_never_fails_on_arguments_a_client_can_send(arguments):
    assert len(message_hash(_call(arguments))) == 64
    assert message_hash(_call(arguments)) != message_hash(_call("{}"))


@pytest.mark.parametrize("arguments, what", [(SURROGATE, "surrogate"), ('"\\udfff"', "surrogate"),
                                             (DEEP, "nested"), ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "nested"),
                                             ('{"a": ' * 1500 + "1" + "}" * 1500, "nested")])
def test_tool_arguments_that_would_fail_later_are_a_400(arguments, what):
    with pytest.raises(BadRequest) as err:
        check_tool_arguments([{"role": "user", "content": "x"}, _call(arguments)])
    assert what in err.value.message and "messages.1.tool_calls.0.function.arguments" in err.value.message


@pytest.mark.parametrize("arguments", ["{}", '{"path": "a.py", "note": "\\u00e9\\ud83d\\ude00"}',
                                       "[" * MAX_DEPTH + "]" * MAX_DEPTH, "not json {{{", '{"a": "\\ud800'])
def test_ordinary_and_non_json_arguments_pass(arguments):
    check_tool_arguments([_call(arguments)])


async def test_a_static_name_too_long_for_the_file_system_is_a_404(aiohttp_client, tmp_path):
    client = await aiohttp_client(create_app(make_settings("http://127.0.0.1:9", tmp_path, sessions=False)))
    for name in ("a" * 300 + ".js", "b" * 5000 + ".css"):
        r = await client.get(f"/pflash/ui/static/{name}")
        assert r.status == 404, (name[:10], r.status)
        assert (await r.json())["error"]["code"] == "not_found"
    assert (await client.get("/pflash/ui/static/session.js")).status == 200
