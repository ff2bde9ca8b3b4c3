"""Inputs with long lines, as agents and users bring them: Wikipedia-like paragraphs (one per line, as RULER's QA
documents), a raw HTML page as fetched, a JSON API answer on one line, a minified script.  Each holds one planted
fact (``FACTS``) that a question asks about."""

from __future__ import annotations

import json
import random

FACTS = {
    "wiki": ("The lighthouse keeper Orrin Vale hid the brass compass under the third stair of the tower.",
             "Where did the lighthouse keeper Orrin Vale hide the brass compass?"),
    "html": ("The night ferry to Skerrow leaves from pier 14 at 23:40 on Thursdays.",
             "From which pier does the night ferry to Skerrow leave?"),
    "json": ('"username": "quillfeather", "email": "marisol.quint@example.org"',
             "What is the email address of the user quillfeather?"),
    "js": ('var zephyrRelayToken="ZR-5581-KESTREL"',
           "What is the value of zephyrRelayToken in this script?"),
}

_SUBJECTS = ["The river", "The council", "Its harbour", "The old market", "A later survey", "The cathedral",
             "The railway company", "Local historians", "The university", "The town's guilds", "Dr. Hallam",
             "The 1911 census", "Mr. Brandt", "The St. Olave parish"]
_VERBS = ["recorded", "described", "rebuilt", "expanded", "mapped", "taxed", "restored", "surveyed", "praised",
          "questioned"]
_OBJECTS = ["the northern quay", "a wool exchange of some 3.5 hectares", "the bridge over the Ouse",
            "the toll roads, i.e. the turnpikes", "\"the finest weir in the county\"", "its grain stores",
            "the approx. 1,200 households", "the mills (e.g. Fenwick's and Abbot's)", "the county records",
            "a school for 240 pupils"]
_TAILS = ["in 1642", "after the great flood of 1771", "during the reign of Edward III", "by the U.S. consul",
          "with a loan of £4,500", "at a cost of 2.75 million crowns", "over the following decades",
          "for the first time", "in its annual report", "despite fierce opposition"]


def _sentence(rng: random.Random) -> str:
    return (f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_TAILS)}, "
            f"and {rng.choice(_SUBJECTS).lower()} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} "
            f"{rng.choice(_TAILS)}.")


def wiki_paragraphs(n: int = 8, sentences: int = 40, seed: int = 7, fact_at: int = 5) -> str:
    """RULER-style documents: ``Document i:`` then one paragraph per line, each well over 512 tokens."""
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        sents = [_sentence(rng) for _ in range(sentences)]
        if i == fact_at:
            sents[sentences // 2] = FACTS["wiki"][0]
        docs.append(f"Document {i + 1}:\n" + " ".join(sents))
    return "\n\n".join(docs)


def html_page(items: int = 60, seed: int = 3) -> str:
    """A raw web page as fetched: one line, head with meta/style/script, navigation, an article, a footer."""
    rng = random.Random(seed)
    head = ('<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
            'content="width=device-width, initial-scale=1"><title>Timetables | Northern Isles Ferries</title>'
            '<link rel="stylesheet" href="/static/site.4f2a.css"><style>body{font-family:sans-serif;margin:0}'
            '.nav a{color:#036;padding:4px 8px}.fare td{text-align:right}</style><script>window.dataLayer='
            'window.dataLayer||[];function gtag(){dataLayer.push(arguments)}gtag("js",new Date());</script></head>')
    nav = '<body><header><nav class="nav">' + "".join(
        f'<a href="/route/{r}">{r.title()}</a>' for r in ("skerrow", "halmay", "dunross", "vey", "orkney")) \
        + "</nav></header>"
    rows = []
    for _ in range(items):
        port = rng.choice(["Halmay", "Dunross", "Vey", "Brinsay", "Tarn", "Oskel"])
        rows.append(f'<tr class="fare"><td>{port}</td><td>{rng.randint(5, 22):02d}:{rng.choice(["00", "15", "30", "45"])}'
                    f'</td><td>pier {rng.randint(1, 12)}</td><td>£{rng.randint(8, 60)}.{rng.randint(0, 99):02d}</td></tr>')
    paras = []
    for _ in range(items // 3):
        paras.append(f"<p>Sailings to {rng.choice(['Halmay', 'Dunross', 'Vey', 'Brinsay'])} may be delayed in "
                     f"heavy weather; passengers with vehicles should arrive <strong>{rng.randint(20, 60)} "
                     f"minutes</strong> before departure and keep their booking reference to hand.</p>")
    paras.insert(len(paras) // 2, f"<p>{FACTS['html'][0]}</p>")
    article = ('<main><article><h1>Timetables and fares</h1>' + "".join(paras[: len(paras) // 2])
               + '<table><thead><tr><th>Port</th><th>Departs</th><th>Pier</th><th>Fare</th></tr></thead><tbody>'
               + "".join(rows) + "</tbody></table>" + "".join(paras[len(paras) // 2:]) + "</article></main>")
    foot = ('<footer><ul><li><a href="/about">About us</a></li><li><a href="/privacy">Privacy</a></li>'
            '<li>© 2024 Northern Isles Ferries Ltd.</li></ul></footer><script src="/static/app.9c1e.js" defer>'
            '</script></body></html>')
    return head + nav + article + foot


def json_answer(users: int = 120, seed: int = 5) -> str:
    """A JSON API answer on one line (a paginated list of users with nested objects)."""
    rng = random.Random(seed)
    data = []
    for i in range(users):
        data.append({
            "id": 1000 + i, "username": f"user{rng.randint(1000, 9999)}",
            "email": f"person{i}@example.org", "active": rng.random() > 0.2,
            "profile": {"city": rng.choice(["Oslo", "Lima", "Perth", "Quito", "Turku"]),
                        "joined": f"20{rng.randint(10, 23)}-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}",
                        "roles": rng.sample(["admin", "editor", "viewer", "billing", "support"], 2)},
            "stats": {"posts": rng.randint(0, 500), "followers": rng.randint(0, 9000)},
        })
    text = json.dumps({"page": 1, "per_page": users, "total": users, "data": data})
    target = json.dumps(data[users * 2 // 3])
    planted = target.replace(f'"username": "{data[users * 2 // 3]["username"]}"', '"username": "quillfeather"') \
        .replace(f'"email": "person{users * 2 // 3}@example.org"', '"email": "marisol.quint@example.org"')
    return text.replace(target, planted)


def minified_js(modules: int = 150, seed: int = 9) -> str:
    """A minified bundle on one line: an IIFE of modules, string literals holding ``;`` and braces."""
    rng = random.Random(seed)
    mods = []
    for i in range(modules):
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        mods.append(f'{i}:function(e,t,n){{"use strict";var r=n({a}),o=n({b});function i(e){{if(!e)return"none;{{}}";'
                    f'for(var t=0;t<e.length;t++){{o.push(e[t]*{a})}}return r.join("-")}}'
                    f't.handler{i}=function(e){{return i(e)||"mod{i}"}};e.exports={{name:"mod{i}",run:i}}}}')
    mods.insert(modules // 2, f'{modules}:function(e,t){{{FACTS["js"][0]};t.token=function(){{return zephyrRelayToken}}}}')
    return "!function(e){var t={};function n(r){if(t[r])return t[r].exports;var o=t[r]={exports:{}};" \
        "return e[r].call(o.exports,o,o.exports,n),o.exports}n(0)}({" + ",".join(mods) + "});"
