import ast
import json
import os
import subprocess
import sys
import textwrap
from dataclasses import asdict

import pytest

from pflash_proxy.bench.cases import FAMILIES, case_tokens, generate, messages_text
from pflash_proxy.bench.cases._families import (CHARACTER_NAMES, NOLIMA_NEEDLES, NOLIMA_QUESTION, NOLIMA_TABLE,
                                                content_words)
from pflash_proxy.bench.cases.base import prose_paragraphs
from pflash_proxy.bench.cases.generator import gold_in_messages


def longest(case) -> str:
    return max((m["content"] for m in case.messages if isinstance(m.get("content"), str)), key=len)


def norm_ws(text: str) -> str:
    return " ".join(text.split())


def test_every_family_at_every_length(bench_cases):
    assert sorted({c.family for c in bench_cases}) == sorted(FAMILIES)
    assert {(c.family, c.target_tokens) for c in bench_cases} == {(f, t) for f in FAMILIES for t in (16_384, 32_768)}
    assert len({c.case_id for c in bench_cases}) == len(bench_cases)


def test_gold_evidence_is_in_the_haystack_for_every_family_and_turn(bench_cases):
    for case in bench_cases:
        assert case.gold and all(g.strip() for g in case.gold), case.case_id
        for turn in range(len(case.followups) + 1):
            assert all(gold_in_messages(case, turn)), (case.case_id, turn)
        hay = longest(case)
        for g in case.gold:  # the evidence lives in the long message, not in the question
            assert g in hay and g not in case.question, case.case_id


def test_lengths_land_within_ten_percent_of_target(bench_cases):
    for case in bench_cases:
        ratio = case_tokens(case) / case.target_tokens
        assert 0.9 <= ratio <= 1.1, (case.case_id, ratio)


def test_custom_token_counter_sets_the_length():
    words = lambda text: len(text.split())  # noqa: E731  (a very different "tokenizer")
    cases = generate(["ruler_single", "code", "agent", "aggregation"], lengths=[6000], seed=3, count_tokens=words)
    for case in cases:
        ratio = case_tokens(case, words) / 6000
        assert 0.9 <= ratio <= 1.1, (case.case_id, ratio)
        assert case_tokens(case) > 6000 * 1.3  # bytes/4 would have sized it much shorter


def test_haystack_is_real_varied_prose_not_a_repeated_sentence(by_family):
    hay = longest(by_family["ruler_single"][1])
    paragraphs = [p for p in hay.split("\n\n") if p]
    assert len(set(paragraphs)) >= 0.95 * len(paragraphs) and len(paragraphs) > 50
    pool = set(prose_paragraphs())
    assert sum(p not in pool for p in paragraphs) == 3  # the intro, the needle and the question


def test_ruler_answers_and_distractors(by_family):
    for case in by_family["ruler_single"] + by_family["ruler_multiquery"] + by_family["ruler_multivalue"]:
        answers = case.answer if isinstance(case.answer, list) else [case.answer]
        assert len(answers) == len(case.gold) and all(a in g for a, g in zip(answers, case.gold))
        assert all(a not in case.question for a in answers)
    for case in by_family["ruler_multivalue"]:
        key = case.gold[0].split(" for ")[1].split(" is:")[0]
        assert all(f" for {key} is:" in g for g in case.gold) and len(case.gold) == 4
    for case in by_family["ruler_multikey"]:
        hay = longest(case)
        key = case.gold[0].split(" for ")[1].split(" is:")[0]
        assert len(case.gold) == 1 and case.answer in case.gold[0]
        for other in case.meta["distractor_keys"]:
            assert f"special magic numbers for {other} is:" in hay
            assert set(other.split("-")) & set(key.split("-"))  # similar form: shares a word with the key


def test_vartrack_only_first_hop_shares_words_with_question(by_family):
    for case in by_family["vartrack"]:
        q = content_words(case.question)
        assert content_words(case.gold[0]) & q
        for hop in case.gold[1:]:
            assert not content_words(hop) & q, hop
        hay = longest(case)
        positions = [hay.index(g) for g in case.gold]
        assert positions == sorted(positions)  # the chain reads forward
        assert case.answer == [g.split(" = ")[0] for g in case.gold]
        assert hay.count(f"= {case.meta['value']}") == 1


def test_nolima_question_shares_no_content_words_with_its_needle(by_family):
    for case in by_family["nolima"]:
        needle = case.gold[0]
        assert case.answer in needle
        assert not content_words(needle) & content_words(case.question), (needle, case.question)
        hay = longest(case)
        assert hay.count(case.meta["city"]) == 1  # only in the question: the haystack never names it
        assert hay.count(case.answer) == 1


@pytest.mark.parametrize("landmark,city", NOLIMA_TABLE)
def test_nolima_table_rows_share_no_content_words(landmark, city):
    assert len(NOLIMA_TABLE) >= 12
    q = content_words(NOLIMA_QUESTION.format(city=city))
    for template in NOLIMA_NEEDLES:
        for name in CHARACTER_NAMES:
            assert not content_words(template.format(name=name, landmark=landmark)) & q


def test_code_docstring_removed_function_kept(by_family):
    for case in by_family["code"] + [c for c in by_family["agent"] if c.meta["variant"] == "source"]:
        hay = longest(case)
        doc = case.meta["docstring"]
        first_sentence = norm_ws(doc.split("\n\n")[0]).split(". ")[0]
        assert first_sentence not in norm_ws(hay), case.case_id
        assert norm_ws(doc) not in norm_ws(hay)
        gold = case.gold[0]
        assert hay.count(gold) == 1
        tree = ast.parse(textwrap.dedent(gold))
        fn = tree.body[0]
        assert isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name == case.answer
        assert ast.get_docstring(fn) is None
        assert hay.count(f"def {case.answer}(") == 1
        assert case.answer not in case.question
        assert case.question.startswith(("Which function", "In the files under Lib/, which function"))


def test_code_haystack_is_whole_real_modules(by_family):
    case = by_family["code"][0]
    hay = longest(case)
    headers = [line for line in hay.split("\n") if line.startswith("# ===== Lib/")]
    assert len(headers) >= 2
    import sysconfig

    for header in headers:
        path = header.removeprefix("# ===== ").removesuffix(" =====")
        if path == case.meta["path"]:
            continue
        with open(os.path.join(sysconfig.get_paths()["stdlib"], path.removeprefix("Lib/")), encoding="utf-8") as fh:
            assert f"{header}\n{fh.read()}" in hay


def test_agent_shape(by_family):
    variants = set()
    for case in by_family["agent"]:
        variants.add(case.meta["variant"])
        roles = [m["role"] for m in case.messages]
        assert roles == ["system", "user", "assistant", "tool"]
        call = case.messages[2]["tool_calls"][0]
        assert call["function"]["name"] == "read_file" and json.loads(call["function"]["arguments"])
        assert case.messages[3]["tool_call_id"] == call["id"]
        assert case.gold[0] in case.messages[3]["content"] and case.gold[0] not in case.messages[1]["content"]
        assert case.meta["tools"][0]["function"]["name"] == "read_file"
        if case.meta["variant"] == "log":
            assert case.answer in case.gold[0] and case.gold[0].count("\n") >= 5
            tenant = case.question.split("tenant ")[1].split(" ")[0]
            assert tenant in case.gold[0]
            assert case.messages[3]["content"].count("ERROR [worker.export]") >= 4  # distractor failures
    assert variants == {"log", "source"}


def test_multiturn_followups_ask_about_far_lines(by_family):
    for case in by_family["multiturn"]:
        doc = case.messages[0]["content"]
        a = doc.index(case.gold[0])
        assert f"Section {case.meta['section']}" in case.question
        section_start = doc.index(f"## Section {case.meta['section']}\n")
        assert section_start < a and f"## Section {case.meta['section'] + 1}\n" not in doc[section_start:a]
        assert len(case.followups) == 3
        for k, fu in enumerate(case.followups, start=1):
            assert abs(doc.index(fu.gold[0]) - a) > 0.3 * len(doc)
            msgs = case.turn_messages(k)
            assert [m["role"] for m in msgs] == ["user"] + ["assistant", "user"] * k
            assert msgs[-1]["content"] == fu.question and fu.gold[0] not in fu.question
            assert fu.answer in fu.gold[0]
        assert case.turn_messages(1, replies=["It left with 5 crates."])[1]["content"] == "It left with 5 crates."


def test_aggregation_is_a_flagged_negative_control(bench_cases, by_family):
    assert {c.family for c in bench_cases if c.negative_control} == {"aggregation"}
    for case in by_family["aggregation"]:
        hay = longest(case)
        product = case.meta["product"]
        matching = [line for line in hay.split("\n") if f"| product: {product} |" in line]
        assert matching == case.gold and len(matching) >= 5
        if isinstance(case.answer, list):
            assert case.answer == [line.split(" |")[0] for line in matching]
        else:
            assert case.answer == str(len(matching))


def test_same_seed_same_cases_other_seed_other_cases(bench_cases):
    again = generate(lengths=(16_384, 32_768), per_family=1, seed=7)
    assert [asdict(c) for c in again] == [asdict(c) for c in bench_cases]
    other = generate(["nolima", "code"], lengths=(16_384,), seed=8)
    assert all(o.messages != c.messages for o in other for c in bench_cases)
    alone = generate(["vartrack"], lengths=(32_768,), seed=7)[0]
    assert asdict(alone) == asdict(next(c for c in bench_cases if c.case_id == alone.case_id))


def _digest_in_subprocess(hash_seed: str) -> str:
    code = ("import hashlib, json; from dataclasses import asdict; from pflash_proxy.bench.cases import generate; "
            "print(hashlib.sha256(json.dumps([asdict(c) for c in generate(lengths=[4096], seed=5)]).encode())"
            ".hexdigest())")
    env = dict(os.environ, PYTHONHASHSEED=hash_seed)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_deterministic_across_processes_and_hash_seeds():
    assert _digest_in_subprocess("1") == _digest_in_subprocess("2")


def test_unknown_family_is_refused():
    with pytest.raises(ValueError):
        generate(["needle"], lengths=[4096])
    assert {c.family for c in generate(["ruler"], lengths=[4096])} == {
        "ruler_single", "ruler_multikey", "ruler_multivalue", "ruler_multiquery"}


def test_messages_text_counts_tool_calls_and_parts():
    msgs = [{"role": "user", "content": [{"type": "text", "text": "alpha"}]},
            {"role": "assistant", "content": None,
             "tool_calls": [{"function": {"name": "grep", "arguments": '{"pattern": "beta"}'}}]}]
    text = messages_text(msgs)
    assert text.index("alpha") < text.index("grep") < text.index("beta")


def test_long_targets_use_the_extended_pool_without_repeats():
    case = generate(["nolima"], lengths=[131_072], seed=2)[0]
    paragraphs = longest(case).split("\n\n")
    assert len(set(paragraphs)) == len(paragraphs)
    assert 0.9 <= case_tokens(case) / 131_072 <= 1.1
    assert all(gold_in_messages(case))
