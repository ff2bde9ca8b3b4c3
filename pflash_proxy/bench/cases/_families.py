"""Case builders, one per family, for `pflash_proxy.bench.cases.generator.generate`.

Every builder follows the same steps:
1. Draw the evidence from the case's seeded rng (keys, values, names, facts, a function, a log block, records).
2. Write `render(filler) -> messages`, which places the evidence at pre-drawn depths among the filler units.
3. `ctx.fit(render, pool, forbid)` picks filler so the rendered case meets the target length, skipping filler
   that contains any evidence word.
4. Return the `Case` with gold = the planted text exactly as rendered (id, family and target are set by
   `generate`).
The code family and the agent "source" variant share `_code_evidence` (pick a documented function, drop its
docstring, question from the docstring's first sentence) in `pflash_proxy.bench.cases._code`.
"""

from __future__ import annotations

import json
import math
import re
from typing import Callable

from pflash_proxy.bench.cases import _code
from pflash_proxy.bench.cases._logs import agent_log
from pflash_proxy.bench.cases.base import Case, FollowUp, Ctx, messages_text, place, prose_sentences
from pflash_proxy.jsontypes import ChatMessage, JSONObject, JSONValue, ToolCall

ADJECTIVES = ["amber", "silent", "crimson", "hollow", "brisk", "velvet", "gilded", "frosty", "lucid", "rustic",
              "somber", "tawny", "vivid", "wistful", "zesty", "mellow", "dusky", "nimble", "placid", "russet"]
NOUNS = ["falcon", "harbor", "lantern", "meadow", "quarry", "thicket", "orchard", "beacon", "canyon", "spindle",
         "trellis", "marten", "glacier", "bramble", "pylon", "saddle", "cobble", "heron", "kettle", "mosaic"]

RULER_INTRO = ("Some special magic numbers are hidden within the following text. Make sure to memorize them. "
               "I will quiz you about the numbers afterwards.")

# (needle landmark, city the question names). Needle and question share no content words by construction.
NOLIMA_TABLE: list[tuple[str, str]] = [
    ("Semper Opera House", "Dresden"), ("Kiasma museum", "Helsinki"), ("Sagrada Familia", "Barcelona"),
    ("Hagia Sophia", "Istanbul"), ("Petronas Towers", "Kuala Lumpur"), ("Kinkaku-ji temple", "Kyoto"),
    ("Charles Bridge", "Prague"), ("Little Mermaid statue", "Copenhagen"), ("Atomium", "Brussels"),
    ("Space Needle", "Seattle"), ("Table Mountain", "Cape Town"), ("Parthenon", "Athens"),
    ("Brandenburg Gate", "Berlin"), ("Burj Khalifa", "Dubai"), ("Colosseum", "Rome"),
    ("Christ the Redeemer statue", "Rio de Janeiro"),
]
NOLIMA_NEEDLES = ["{name} lives next to the {landmark}.",
                  "Actually, {name} could see the {landmark} from the hotel window.",
                  "There was a photo of {name} standing right in front of the {landmark}."]
NOLIMA_QUESTION = "Which character has been to {city}?"
CHARACTER_NAMES = ["Yuki", "Stuart", "Katie", "Diana", "Mandla", "Elodie", "Rohan", "Ingrid", "Tomasz",
                   "Aiyana", "Olusegun", "Marisol", "Henrik", "Priya", "Caspian", "Noor"]

STOPWORDS = frozenset("""a an the and or but if of to in on at by for with from into onto over under about as is
are was were be been being has have had do does did which who whom whose what when where why how that this these
those it its there their they them he she his her i you we me my our your not no so too very can could would
should will shall may might must just actually right""".split())


def content_words(text: str) -> set[str]:
    """Lowercased words of `text` minus stopwords (used to prove a NoLiMa needle and question share none)."""
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in STOPWORDS}


def _user(text: str) -> list[ChatMessage]:
    return [{"role": "user", "content": text}]


def _keys(ctx: Ctx, n: int) -> list[str]:
    pairs = ctx.rng.sample([(a, b) for a in ADJECTIVES for b in NOUNS], n)
    return [f"{a}-{b}" for a, b in pairs]


def _magic(ctx: Ctx, taken: set[str]) -> str:
    while (v := str(ctx.rng.randint(1_000_000, 9_999_999))) in taken:
        pass
    taken.add(v)
    return v


def _needle(key: str, value: str) -> str:
    return f"One of the special magic numbers for {key} is: {value}."


def _haystack_case(ctx: Ctx, intro: str, evidence: list[str], question: str, gold: list[str],
                   answer: str | list[str], forbid: list[str], tail: str = "", **meta: JSONValue) -> Case:
    """A single user message: intro, real prose with `evidence` paragraphs at random depths, then the question."""
    depths = ctx.depths(len(evidence))

    def render(filler: list[str]) -> list[ChatMessage]:
        body = "\n\n".join(place(filler, evidence, depths))
        return _user(f"{intro}\n\n{body}\n\n{question}{tail}")

    filler = ctx.fit(render, ctx.prose(), forbid=forbid + evidence)
    return Case("", "", render(filler), question, gold, answer, False, 0, meta=meta)


def build_ruler(ctx: Ctx, variant: str) -> Case:
    taken: set[str] = set()
    if variant == "multikey":
        adj, noun = ctx.rng.choice(ADJECTIVES), ctx.rng.choice(NOUNS)
        others_a = ctx.rng.sample([a for a in ADJECTIVES if a != adj], 3)
        others_n = ctx.rng.sample([n for n in NOUNS if n != noun], 3)
        key = f"{adj}-{noun}"
        distractors = [f"{a}-{noun}" for a in others_a] + [f"{adj}-{n}" for n in others_n]
        keys, values = [key] + distractors, [_magic(ctx, taken) for _ in range(7)]
        needles = [_needle(k, v) for k, v in zip(keys, values)]
        ctx.rng.shuffle(order := list(range(7)))
        q = f"What is the special magic number for {key} mentioned in the provided text?"
        return _haystack_case(ctx, RULER_INTRO, [needles[i] for i in order], q, [needles[0]], values[0],
                              keys + values, distractor_keys=distractors)
    if variant == "multivalue":
        key = _keys(ctx, 1)[0]
        values = [_magic(ctx, taken) for _ in range(4)]
        needles = [_needle(key, v) for v in values]
        q = f"What are all the special magic numbers for {key} mentioned in the provided text?"
        return _haystack_case(ctx, RULER_INTRO, needles, q, needles, values, [key] + values)
    n = 4 if variant == "multiquery" else 1
    keys = _keys(ctx, n)
    values = [_magic(ctx, taken) for _ in keys]
    needles = [_needle(k, v) for k, v in zip(keys, values)]
    order = list(range(n))
    ctx.rng.shuffle(order)
    if n == 1:
        q = f"What is the special magic number for {keys[0]} mentioned in the provided text?"
        answer: str | list[str] = values[0]
    else:
        q = (f"What are all the special magic numbers for {', '.join(keys[:-1])} and {keys[-1]} mentioned in the "
             "provided text?")
        answer = values
    return _haystack_case(ctx, RULER_INTRO, [needles[i] for i in order], q, needles, answer, keys + values)


def build_vartrack(ctx: Ctx) -> Case:
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    names: set[str] = set()
    while len(names) < 15:
        names.add("VAR_" + "".join(ctx.rng.choice(letters) for _ in range(5)))
    pool = sorted(names)
    ctx.rng.shuffle(pool)
    values = [str(v) for v in ctx.rng.sample(range(10_000, 99_999), 3)]
    chains = []
    for c in range(3):
        chain_vars = pool[c * 5:(c + 1) * 5]
        lines = [f"{chain_vars[0]} = {values[c]}"] + [f"{chain_vars[j]} = {chain_vars[j - 1]}" for j in range(1, 5)]
        chains.append((chain_vars, lines, ctx.depths(5)))
    items = sorted((d, line) for _, lines, depths in chains for d, line in zip(depths, lines))
    hop_lines, depths = [line for _, line in items], [d for d, _ in items]
    q = (f"Find all variables that are assigned the value {values[0]} in the text above, directly or through "
         "other variables.")
    intro = "Memorize and track the chain(s) of variable assignments hidden in the following text."

    def render(filler: list[str]) -> list[ChatMessage]:
        return _user(f"{intro}\n\n" + "\n\n".join(place(filler, hop_lines, depths)) + f"\n\nQuestion: {q}")

    filler = ctx.fit(render, ctx.prose(), forbid=list(names) + values)
    target_vars, target_lines, _ = chains[0]
    return Case("", "", render(filler), q, list(target_lines), list(target_vars), False, 0,
                meta={"value": values[0]})


def build_nolima(ctx: Ctx) -> Case:
    landmark, city = ctx.rng.choice(NOLIMA_TABLE)
    name = ctx.rng.choice(CHARACTER_NAMES)
    needle = ctx.rng.choice(NOLIMA_NEEDLES).format(name=name, landmark=landmark)
    q = NOLIMA_QUESTION.format(city=city)
    return _haystack_case(ctx, "Read the following text carefully.", [needle], f"Question: {q}", [needle],
                          name, [name, city, landmark], tail=" Answer with the name only.",
                          landmark=landmark, city=city)


def _code_case(ctx: Ctx, agent: bool) -> Case:
    ev = _code.code_evidence(ctx)
    depth = ctx.rng.random()
    pool = _code.filler_modules(ev)

    def files(filler: list[str]) -> str:
        return "\n\n".join(place(filler, [ev.block], [depth]))

    if not agent:
        intro = ("I'm reading the following Python files (concatenated below; each starts with a "
                 "`# ===== path =====` header line).")

        def render(filler: list[str]) -> list[ChatMessage]:
            return _user(f"{intro}\n\n```python\n{files(filler)}\n```\n\n{ev.question}")
    else:
        task = f"In the files under Lib/, {ev.question[0].lower()}{ev.question[1:]}"

        def render(filler: list[str]) -> list[ChatMessage]:
            paths = [b.split("\n", 1)[0].strip("# =") for b in place(filler, [ev.block], [depth])]
            return _agent_messages(task, "read_file", {"paths": paths}, files(filler))

    filler = ctx.fit(render, pool, cycle=False)
    question = task if agent else ev.question
    return Case("", "", render(filler), question, [ev.gold], ev.name, False, 0,
                meta={"path": ev.path, "function": ev.qualname, "docstring": ev.docstring,
                      "variant": "source" if agent else "code"})


def build_code(ctx: Ctx) -> Case:
    return _code_case(ctx, agent=False)


AGENT_SYSTEM = ("You are a careful software agent. Use the tools to inspect files and logs, then answer the user's "
                "question concisely.")
AGENT_TOOLS: list[JSONValue] = [
    {"type": "function", "function": {"name": "read_file", "description": "Read one or more files.",
                                      "parameters": {"type": "object", "properties": {
                                          "path": {"type": "string"},
                                          "paths": {"type": "array", "items": {"type": "string"}}}}}},
    {"type": "function", "function": {"name": "grep", "description": "Search files for a pattern.",
                                      "parameters": {"type": "object", "properties": {
                                          "pattern": {"type": "string"}, "path": {"type": "string"}},
                                          "required": ["pattern"]}}},
]


def _agent_messages(task: str, tool: str, args: JSONObject, output: str) -> list[ChatMessage]:
    call: ToolCall = {"id": "call_0001", "type": "function", "function": {"name": tool, "arguments": json.dumps(args)}}
    return [{"role": "system", "content": AGENT_SYSTEM}, {"role": "user", "content": task},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_0001", "content": output}]


def build_agent(ctx: Ctx) -> Case:
    """Log variant at 16K, 64K, ... and source variant at 32K, 128K, ... (alternating by index too)."""
    octave = round(math.log2(max(ctx.nominal, 1) / 16_384))  # the labelled length, not a resizing target
    if (ctx.index + octave) % 2:
        case = _code_case(ctx, agent=True)
    else:
        log = agent_log(ctx, lambda task, path, text: _agent_messages(task, "read_file", {"path": path}, text))
        case = Case("", "", _agent_messages(log.task, "read_file", {"path": log.path}, log.text), log.task,
                    [log.gold], log.answer, False, 0, meta={"variant": "log", "path": log.path})
    case.meta["tools"] = AGENT_TOOLS
    return case


FACTS: list[tuple[str, str, Callable[[dict[str, int | str]], str]]] = [
    ("The maintenance window for the {x} cluster starts at {hh:02d}:{mm:02d} UTC.",
     "When does the maintenance window for the {x} cluster start?", lambda v: f"{v['hh']:02d}:{v['mm']:02d} UTC"),
    ("The {x} vault is opened with the passphrase {w}-{n}.", "What passphrase opens the {x} vault?",
     lambda v: f"{v['w']}-{v['n']}"),
    ("Invoices for the {x} account are sent to {w}{n}@example.org.", "Where are invoices for the {x} account sent?",
     lambda v: f"{v['w']}{v['n']}@example.org"),
    ("The {x} shipment left the warehouse with {n} crates.", "How many crates did the {x} shipment leave with?",
     lambda v: str(v["n"])),
    ("The {x} rollout was approved by {p} on a Tuesday.", "Who approved the {x} rollout?", lambda v: str(v["p"])),
]
CODENAMES = ["Orion", "Kestrel", "Juniper", "Halcyon", "Marlowe", "Tundra", "Sable", "Vireo", "Calliope",
             "Brackwater", "Quillon", "Ptarmigan"]


def build_multiturn(ctx: Ctx) -> Case:
    """Turn 1 pastes a sectioned document and asks about a fact in section A; follow-ups ask about facts planted
    in sections at the other end of the document (lines the first turn's compression would leave out)."""
    xs = ctx.rng.sample(CODENAMES, 4)
    kinds = ctx.rng.sample(range(len(FACTS)), 4)
    facts = []
    for x, k in zip(xs, kinds):
        v: dict[str, int | str] = {"x": x, "hh": ctx.rng.randrange(24), "mm": ctx.rng.choice([0, 15, 30, 45]),
             "w": ctx.rng.choice(NOUNS), "n": ctx.rng.randint(100, 999), "p": ctx.rng.choice(CHARACTER_NAMES)}
        stmt, q, ans = FACTS[k]
        facts.append((stmt.format(**v), q.format(**v), ans(v)))
    a_first = ctx.rng.random() < 0.5
    a_depth = ctx.rng.uniform(0.03, 0.25) if a_first else ctx.rng.uniform(0.75, 0.97)
    far = sorted(ctx.rng.uniform(0.6, 0.97) if a_first else ctx.rng.uniform(0.03, 0.4) for _ in range(3))
    order = sorted(zip([a_depth] + far, range(4)))
    evidence, depths = [facts[i][0] for _, i in order], [d for d, _ in order]
    section_sizes = [ctx.rng.randint(5, 9) for _ in range(400)]
    holder: dict[str, int] = {}

    def render(filler: list[str]) -> list[ChatMessage]:
        paras = place(filler, evidence, depths)
        out, i, s = [], 0, 0
        while i < len(paras):
            out.append(f"## Section {s + 1}")
            for p in paras[i:i + section_sizes[s]]:
                if p == facts[0][0]:
                    holder["section"] = s + 1
                out.append(p)
            i, s = i + section_sizes[s], s + 1
        doc = "\n\n".join(out)
        q0 = f"According to Section {holder.get('section', 1)}: {facts[0][1]}"
        return _user(f"Here is a long document; I will ask you several questions about it.\n\n{doc}\n\n{q0}")

    filler = ctx.fit(render, ctx.prose(), forbid=xs + [f[2] for f in facts])
    messages = render(filler)
    q0 = f"According to Section {holder['section']}: {facts[0][1]}"
    followups = [FollowUp(f"Back to the document from my first message: {q}", [stmt], ans)
                 for stmt, q, ans in facts[1:]]
    return Case("", "", messages, q0, [facts[0][0]], facts[0][2], False, 0, followups=followups,
                meta={"section": holder["section"]})


PRODUCTS = ["Quillmate", "Borealis Hub", "Tallyframe", "Nimbolt", "Cartwheel Pro", "Lumenstack", "Driftnote",
            "Verdigris", "Pollenware", "Skiffboard"]
TEAMS = ["billing", "support", "platform", "mobile", "data", "security", "growth"]


def build_aggregation(ctx: Ctx) -> Case:
    """Many one-line records; the question needs every record that names one product (negative control)."""
    product = ctx.rng.choice(PRODUCTS)
    sentences = prose_sentences()
    n_est = max(20, ctx.target * 4 // 150)
    ids = sorted(ctx.rng.sample(range(10_000, 99_999), n_est * 2))
    records = []
    for rid in ids:
        prod = product if ctx.rng.random() < 0.04 else ctx.rng.choice([p for p in PRODUCTS if p != product])
        month, day = ctx.rng.randint(1, 12), ctx.rng.randint(1, 28)
        records.append(f"REC-{rid} | 2026-{month:02d}-{day:02d} | team: {ctx.rng.choice(TEAMS)} | product: {prod} "
                       f"| note: {ctx.rng.choice(sentences)}")
    count_q = ctx.rng.random() < 0.5
    q = (f"How many records mention the product {product}?" if count_q
         else f"List the ID of every record that mentions the product {product}.")
    intro = "Below is an export of customer-feedback records, one per line."

    def render(kept: list[str]) -> list[ChatMessage]:
        return _user(f"{intro}\n\n" + "\n".join(kept) + f"\n\n{q}")

    fixed = ctx.count(messages_text(render([])))
    kept, used = [], 0
    for r in records:  # records stay in ID order; stop at the budget
        cost = ctx.count(r + "\n")
        if used + cost > ctx.target - fixed:
            break
        kept.append(r)
        used += cost
    gold = [r for r in kept if f"product: {product} |" in r]
    answer: str | list[str] = str(len(gold)) if count_q else [r.split(" |", 1)[0] for r in gold]
    return Case("", "", render(kept), q, gold, answer, True, 0, meta={"product": product})


BUILDERS: dict[str, Callable[[Ctx], Case]] = {
    "ruler_single": lambda c: build_ruler(c, "single"),
    "ruler_multikey": lambda c: build_ruler(c, "multikey"),
    "ruler_multivalue": lambda c: build_ruler(c, "multivalue"),
    "ruler_multiquery": lambda c: build_ruler(c, "multiquery"),
    "vartrack": build_vartrack,
    "nolima": build_nolima,
    "code": build_code,
    "agent": build_agent,
    "multiturn": build_multiturn,
    "aggregation": build_aggregation,
}
