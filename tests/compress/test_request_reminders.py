"""Claude Code's ``<system-reminder>`` blocks are not the request (issue 25, item 2, as run with Claude Code).

Claude Code puts several reminders (environment, model, token count, date) into the user turn that asks the
question, and one after the Read result.  Taken into the request, their words (file, directory, tokens, code,
line ...) outranked the asked-about function; through the proxy it was dropped from the served file.
"""

from __future__ import annotations

import json
import traceback
from pathlib import Path

from pflash_proxy.compress.pipeline import Compressor
from pflash_proxy.compress.request import RequestFinder, joined_text, request_text
from pflash_proxy.compress.text import TokenizedText

from .test_gutter import function_lines, toy_tokens

ENV = ("<system-reminder>\n# Environment\nYou have been invoked in the following environment: \n"
       " - Primary working directory: /home/user/work\n - Is a git repository: false\n - Platform: linux\n"
       " - Shell: bash\n - Downloaded files and extracted archives are untrusted data: put each in its own new, "
       "empty directory, keep scripts you write in a different directory, and pass paths as arguments instead of "
       "running an interpreter or build tool from inside it. Interpreters load code from the script's directory "
       "and the current directory. Run any Python that reads them with `-I`. This does not apply to code the user "
       "asked you to build or run.\n</system-reminder>")
REMINDERS = [ENV, "<system-reminder>\n<total_tokens>15000000 tokens left</total_tokens>\n</system-reminder>",
             "<system-reminder>\nToday's date is 2026-12-01.\n</system-reminder>\n"]
FUNC = "_extract_caret_anchors_from_line_segment"
TASK = f"Read traceback.py and tell me what {FUNC} does, in one sentence."


def claude_turns(tool_text: str) -> list[dict]:
    """The chat messages the proxy builds from Claude Code's second /v1/messages request."""
    call = {"id": "call_1", "type": "function",
            "function": {"name": "Read", "arguments": json.dumps({"file_path": "/home/user/work/traceback.py"})}}
    return [{"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": [{"type": "text", "text": t} for t in REMINDERS + [TASK]]},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": tool_text}]


def test_reminders_are_left_out_of_the_request():
    msgs = claude_turns("x\n" * 10)
    spec = RequestFinder().find(msgs, 3)
    assert spec.source == "tool-call" and "system-reminder" not in spec.text and "directory" not in spec.text
    assert spec.text == TASK + '\nRead({"file_path": "/home/user/work/traceback.py"})'
    assert "<system-reminder>" in joined_text(msgs[1])  # the message itself is not touched
    assert request_text(msgs[1]).strip() == TASK
    # a later user turn that is only a reminder is no request: the question before it is
    only = {"role": "user", "content": REMINDERS[2]}
    paste = {"role": "assistant", "content": "a long reply\n" * 5}
    spec = RequestFinder().find([msgs[1], paste, only], 1)
    assert spec.source == "latest-user" and spec.text.strip() == TASK


def test_claude_code_read_with_reminders_keeps_the_asked_function():
    """Claude Code 2.1's Read of the stdlib's traceback.py (``N<TAB>line``, the empty last line numbered bare,
    a reminder after it), counted by a digit-splitting tokenizer, the question in a turn full of reminders: the
    asked-about function is served whole (with the reminders in the request it ranked below denser units)."""
    src = Path(traceback.__file__).read_text(encoding="utf-8")
    lines = src.splitlines(keepends=True)
    text = "".join(f"{i}\t{ln}" for i, ln in enumerate(lines, 1)) + f"{len(lines) + 1}\n\n" + REMINDERS[1]
    tt = TokenizedText.from_text(text, [toy_tokens(ln) for ln in TokenizedText.from_text(text).lines])
    msgs = claude_turns(text)
    request = RequestFinder().find(msgs, 3, tt)
    out = Compressor().compress(tt, request, tt.total_tokens, True, "tool")
    assert out.mode == "compressed" and out.gutter == "N<TAB>"
    a, b = function_lines(src, FUNC)
    assert "".join(tt.lines[a:b + 1]) in out.text
