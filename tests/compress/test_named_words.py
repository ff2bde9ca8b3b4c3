"""A definition whose name is an ordinary word ("release", "wait", "Lock") is named only where the request uses
the word as a name: quoted, called, or in a question about it ("How does release work?"); in a user's own words
("the next release raises") it is a word, and its definition is not kept whatever the budget (users'-words code
tasks, dev: anyio's ``release`` methods took 2,053 of an 8K read's 2,645-token budget for a question about
waiting on a condition)."""

from __future__ import annotations

from pflash_proxy.compress.named import named_units
from pflash_proxy.compress.text import TokenizedText
from pflash_proxy.compress.units import UnitSegmenter

SOURCE = "".join(
    f"def step_{k}(queue):\n    queue.advance({k})\n    return queue.state({k}) + {k * 3}\n\n" for k in range(30)
) + ("def release(lock):\n    lock.owner = None\n    lock.waiters.wake_one()\n    return lock\n\n"
     "def parse_header(line):\n    name, _, value = line.partition(':')\n    return name.strip(), value.strip()\n")


def units_of(name: str, tt: TokenizedText, units) -> set[int]:
    return {i for i, u in enumerate(units) if any(tt.lines[k].startswith(f"def {name}(")
                                                  for k in range(u.start_line, u.end_line))}


def test_an_ordinary_word_in_a_users_sentence_names_nothing():
    tt = TokenizedText.from_text(SOURCE)
    units = UnitSegmenter(1, 512).segment(tt)
    assert named_units(tt, units, "If the waiting task is cancelled, the next release raises. Where is that?") == set()
    assert named_units(tt, units, "Can I release it twice without harm?") == set()


def test_an_ordinary_word_used_as_a_name_still_names_its_definition():
    tt = TokenizedText.from_text(SOURCE)
    units = UnitSegmenter(1, 512).segment(tt)
    rel = units_of("release", tt, units)
    for question in ("What does `release` do?", "How does release work, and what does it return?",
                     "In release, what happens step by step?", "Explain release(): who is woken?",
                     "tell me what release does with the waiters", "Show me the release function."):
        assert rel <= named_units(tt, units, question), question
    # an identifier that is no ordinary word is a name wherever it stands
    assert units_of("parse_header", tt, units) <= named_units(tt, units, "the header parse_header gives is wrong")
