// One session: every served message; for a compressed (or whole-served) message its original lines unit by unit:
// kept units plain, omitted units folded in <details>, a heat strip per unit (score -> colour), the request span
// marked, budget and mode above; recall excerpts with the message and lines they came from; above them every turn:
// what the slot held, llama-server's counts and prefill time, tokens avoided and time saved (an estimate).
"use strict";

const SID = decodeURIComponent(location.pathname.split("/").filter(Boolean).pop());
const SHORT_LINES = 24;  // messages without a trace longer than this are folded

function plural(n, word) {
  return `${fmtInt(n)} ${word}${n === 1 ? "" : "s"}`;
}

function lineRange(a, b) {  // 0-based [a, b) -> "lines A–B"
  return b - a === 1 ? `line ${a + 1}` : `lines ${a + 1}–${b}`;
}

function linesBlock(lines, start, end, reqSpan) {
  const box = el("div", {class: "lines"});
  for (let i = start; i < end; i++) {
    const inReq = reqSpan && i >= reqSpan[0] && i < reqSpan[1];
    box.append(el("div", {class: "line" + (inReq ? " req" : "")},
                  el("span", {class: "ln", text: String(i + 1)}), el("span", {class: "tx", text: lines[i]})));
  }
  return box;
}

function heatStrip(u, max) {
  const strip = el("div", {class: "heat", title: `unit ${u.index} · score ${fmtScore(u.score)} · ` +
                                                   `${plural(u.tokens, "token")} · ${lineRange(...u.lines)}`});
  strip.style.background = heatColour(u.score, max);
  return strip;
}

function unitView(trace, u, max, mid) {
  const [a, b] = u.lines;
  const req = trace.request && trace.request.lines;
  const inReq = req && a < req[1] && b > req[0];
  const tags = [u.pinned ? "pinned" : null, inReq ? "request" : null].filter(Boolean);
  const body = trace.lines ? linesBlock(trace.lines, a, b, req)
                           : el("div", {class: "lines gone", text: `${lineRange(a, b)} (text no longer kept)`});
  const id = `m${mid}-u${u.index}`;
  if (u.kept) {
    return el("div", {class: "unit kept" + (inReq ? " has-req" : ""), id: id, "data-unit": u.index,
                      "data-score": u.score, "data-pinned": u.pinned},
              heatStrip(u, max), el("div", {class: "unit-body"},
                tags.length ? el("div", {class: "unit-tags", text: tags.join(" · ")}) : null, body));
  }
  const n = b - a;
  const summary = el("summary", {class: "fold"},
    `… ${plural(n, "line")} omitted (unit ${u.index}, score ${fmtScore(u.score)})`,
    el("span", {class: "muted", text: ` · ${lineRange(a, b)} · ${plural(u.tokens, "token")}`}));
  return el("div", {class: "unit omitted", id: id, "data-unit": u.index, "data-score": u.score}, heatStrip(u, max),
            el("details", {class: "unit-body omitted-fold"}, summary, body));
}

function traceMeta(t) {
  const items = [
    `${fmtInt(t.message_tokens)} → ${fmtInt(t.served_tokens)} tokens`,
    `budget ${fmtInt(t.budget)}`,
    `prompt ${fmtInt(t.prompt_tokens)} (uncached ${fmtInt(t.uncached_tokens)})`,
    `scorer ${t.scorer}`, `segmenter ${t.segmenter}`,
  ];
  if (t.spread !== null && t.spread !== undefined) items.push(`spread ${t.spread.toFixed(3)}`);
  if (t.units.length) {
    items.push(`${plural(t.units.length, "unit")}, ${fmtInt(t.units.filter(u => u.kept).length)} kept`);
  }
  const ms = Object.values(t.stage_ms || {}).reduce((x, y) => x + y, 0);
  if (ms) items.push(`${ms.toFixed(0)} ms`);
  return el("div", {class: "trace-meta"}, el("span", {class: "badge mode-" + t.mode, text: t.mode}),
            ...items.map(s => el("span", {class: "meta-item", text: s})));
}

function requestView(r) {
  if (!r) return null;
  const sources = {"message-tail": "the message's own tail", "latest-user": "the latest user message",
                   "tool-call": "the task and the tool call", "prompt-tail": "the prompt's tail", "none": "none"};
  const where = sources[r.source] || r.source;
  return el("div", {class: "request"},
    el("span", {class: "req-label", text: "request"}),
    ` from ${where}` + (r.lines ? `, ${lineRange(...r.lines)} (marked)` : "") +
      (r.pinned_tail_tokens ? `, last ${fmtInt(r.pinned_tail_tokens)} tokens pinned` : "") + ": ",
    el("q", {text: (r.truncated ? "…" : "") + r.text.trim()}));
}

function compressionView(t, mid) {
  const box = el("div", {class: "trace"}, traceMeta(t));
  if (t.reason) box.append(el("div", {class: "reason", text: "served whole: " + t.reason}));
  box.append(requestView(t.request));
  if (t.text_dropped) {
    box.append(el("div", {class: "muted", text: "the original text of this older trace is no longer kept (bound " +
                                                 "per session); its units and scores are"}));
  }
  if (t.units.length) {
    // colours relative to the best unit the budget chose among (pinned units, the request itself, would
    // outshine everything else)
    const free = t.units.filter(u => !u.pinned);
    const max = Math.max(...(free.length ? free : t.units).map(u => u.score), 0);
    box.append(el("div", {class: "doc"}, t.units.map(u => unitView(t, u, max, mid))));
  } else if (t.lines) {
    box.append(el("details", {}, el("summary", {text: `original (${plural(t.lines.length, "line")})`}),
                  linesBlock(t.lines, 0, t.lines.length, null)));
  }
  return box;
}

function recallView(t) {
  return el("div", {class: "recall"},
    el("div", {class: "trace-meta"}, el("span", {class: "badge mode-recall", text: "recall"}),
       el("span", {class: "meta-item", text: `${plural(t.excerpts.length, "excerpt")} prepended`}),
       el("span", {class: "meta-item", text: `omitted share of relevance ${t.share.toFixed(3)}`})),
    el("ul", {class: "excerpts"}, t.excerpts.map(e => {
      const src = Number(e.from_message) - 1;
      const last = e.units[e.units.length - 1];
      const units = e.units.length === 1 ? `unit ${e.units[0]}` : `units ${e.units[0]}–${last}`;
      return el("li", {class: "excerpt"},
        el("div", {},
           "from ", el("a", {href: `#m${src}-u${e.units[0]}`, text: `message ${e.from_message}`}),
           `, ${lineRange(...e.lines)} · ${units} · ${plural(e.tokens, "token")}`),
        el("pre", {class: "excerpt-text", text: e.text}));
    })));
}

function plainText(text) {
  const lines = text.split("\n");
  if (lines.length <= SHORT_LINES) return el("pre", {class: "plain", text: text});
  return el("details", {}, el("summary", {text: `${plural(lines.length, "line")} as served`}),
            el("pre", {class: "plain", text: text}));
}

function messageView(m, traces) {
  const mine = m.traces.map(i => traces[i]);
  const turn = mine.length ? ` · served in turn ${mine[0].turn}` : "";
  const calls = m.tool_calls ? ` · calls ${m.tool_calls.join(", ")}` : "";
  const art = el("article", {class: "message role-" + (m.role || "unknown"), id: `m${m.index}`},
    el("h3", {}, el("span", {class: "role", text: m.role || "?"}), ` message ${m.index + 1}${turn}${calls}`));
  const compression = mine.filter(t => t.kind === "compression");
  for (const t of mine.filter(t => t.kind === "recall")) art.append(recallView(t));
  for (const t of compression) art.append(compressionView(t, m.index));
  if (compression.length) {
    art.append(el("details", {class: "served"}, el("summary", {text: "as served to the model"}),
                  el("pre", {class: "plain", text: m.text})));
  } else {
    art.append(plainText(m.text));
  }
  return art;
}

function fmtSecs(s) {
  if (s === null || s === undefined) return "–";
  return s >= 10 ? `${s.toFixed(1)} s` : s >= 1 ? `${s.toFixed(2)} s` : `${(s * 1000).toFixed(0)} ms`;
}

function savedText(t) {  // "≈ 1.2 s (compression 0.8 s · cache 0.4 s)"
  const c = t.saved_s.compression || 0, k = t.saved_s.cache || 0;
  if (t.saved_s.compression === null && t.saved_s.cache === null) return "–";
  return `≈ ${fmtSecs(c + k)}`;
}

function turnsView(turns, note) {
  const box = document.getElementById("turns");
  if (!turns.length) { box.replaceChildren(); return; }
  const head = ["turn", "client", "slot held", "cached", "prefilled", "not prefilled (compression)",
                "prefill time", "rate", "time saved (estimate)", "first byte", "notes"];
  const rows = turns.map(t => {
    const why = [t.why, ...t.messages.filter(m => m.why).map(m => `message ${m.message + 1}: ${m.why}`)]
      .filter(Boolean);
    if (t.cache === "restored" && t.prepare_ms) why.push(`restore and look-up took ${fmtInt(Math.round(t.prepare_ms - (t.compression_ms || 0)))} ms`);
    if (t.compression_ms) why.push(`compression took ${fmtInt(Math.round(t.compression_ms))} ms`);
    const saved = el("span", {class: "saved", title: note || "",
                              text: savedText(t) + (t.prefilled_tokens === null ? "" :
                                ` (compression ${fmtSecs(t.saved_s.compression)} · cache ${fmtSecs(t.saved_s.cache)})`)});
    return el("tr", {class: "turn", "data-turn": t.turn, "data-cache": t.cache},
      ...[String(t.turn), t.client || "–",
          el("span", {class: "badge cache-" + t.cache, text: t.cache}),
          fmtInt(t.cached_tokens), fmtInt(t.prefilled_tokens), fmtInt(t.tokens_avoided.compression),
          t.prefill_ms === null ? "–" : fmtSecs(t.prefill_ms / 1000),
          t.rate_tps ? `${fmtInt(Math.round(t.rate_tps))} tok/s` : "–", saved,
          t.first_byte_ms === null ? "–" : fmtSecs(t.first_byte_ms / 1000),
          el("span", {class: "why", text: why.join("; ") || "–"})].map(c => el("td", {}, c)));
  });
  box.replaceChildren(el("h2", {text: "Turns"}),
    el("p", {class: "muted", text: "slot held: hit (the slot still held the session), restored (its snapshot was " +
      "read back), miss (prefilled from the start). cached and prefilled are the engine's own counts; " +
      "time saved is an " + (note || "estimate")}),
    el("table", {class: "grid turns"}, el("tr", {}, head.map(h => el("th", {text: h}))), ...rows));
}

function renderMeta(s) {
  const v = s.savings || {};
  const avoided = v.tokens_avoided || {compression: 0, cache: 0};
  const saved = v.saved_s || {compression: 0, cache: 0};
  document.getElementById("meta").replaceChildren(
    card("client", s.client || "–", s.first_words ? `“${s.first_words}”` : null),
    card("turns", fmtInt(s.turns), `${plural(s.messages, "message")} served`),
    card("last use", ago(s.last_use), new Date(s.created * 1000).toLocaleString() + " created"),
    card("compressed", fmtInt(s.compressed), s.served_whole ? `${fmtInt(s.served_whole)} served whole` : null),
    card("tokens in → served", `${fmtInt(s.tokens_in)} → ${fmtInt(s.tokens_served)}`,
         `${fmtInt(s.tokens_saved)} saved`),
    card("recalls", fmtInt(s.recalls)),
    card("prefilled / cached", `${fmtInt(v.prefilled_tokens)} / ${fmtInt(v.cached_tokens)}`,
         `tokens over ${plural(v.turns_timed || 0, "turn")} · prefill ${fmtSecs(v.prefill_s)}`),
    card("time saved (estimate)", `≈ ${fmtSecs((saved.compression || 0) + (saved.cache || 0))}`,
         `compression ${fmtSecs(saved.compression)} (${fmtInt(avoided.compression)} tokens) · cache ` +
         `${fmtSecs(saved.cache)} (${fmtInt(avoided.cache)} tokens)` +
         (v.rate_tps ? ` at ${fmtInt(Math.round(v.rate_tps))} tok/s` : "")),
    card("slot", s.slot === null ? "–" : String(s.slot),
         s.snapshot ? `snapshot ${fmtInt(s.snapshot.tokens)} tokens · ${fmtBytes(s.snapshot.bytes)}` : "no snapshot"));
}

function reveal() {  // #m0-u12: open that unit's fold, if it has one, and show it
  const target = location.hash && document.getElementById(location.hash.slice(1));
  if (!target) return;
  const fold = target.querySelector("details");
  if (fold) fold.open = true;
  target.scrollIntoView({block: "center"});
}

window.addEventListener("hashchange", reveal);

async function load() {
  document.getElementById("sid").textContent = SID;
  try {
    const data = await fetchJSON(`/pflash/api/sessions/${encodeURIComponent(SID)}`);
    renderMeta(data.session);
    turnsView(data.turns || [], (data.session.savings || {}).note);
    document.getElementById("messages").replaceChildren(...data.messages.map(m => messageView(m, data.traces)));
    setStatus(`${plural(data.messages.length, "message")} · ${plural(data.traces.length, "trace")}`);
    reveal();
  } catch (e) {
    setStatus("cannot load: " + e.message, true);
  }
}

load();
