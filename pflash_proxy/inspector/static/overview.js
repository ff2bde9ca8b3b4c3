// Overview: upstream, totals, slots, sessions and the live counters, refreshed every REFRESH_MS.
"use strict";

const REFRESH_MS = 2000;

function row(cells, head) {
  return el("tr", {}, cells.map(c => el(head ? "th" : "td", {}, c)));
}

function sessionLink(id) {
  return id ? el("a", {href: `/pflash/ui/session/${id}`, class: "sid", text: id.slice(0, 12) + "…"}) : "–";
}

function renderUpstream(u) {
  const box = document.getElementById("upstream");
  const model = u.model || {};
  box.replaceChildren(el("div", {class: "kv"},
    el("span", {class: "badge " + (u.ready ? "ok" : "bad"), text: u.ready ? "ready" : "not ready"}),
    el("code", {text: u.url || "–"}),
    model.model_path ? el("span", {class: "muted", text: `${model.model_path} · ${fmtInt(model.total_slots)} slots · `
                                                         + `n_ctx ${fmtInt(model.n_ctx)}`}) : null,
    u.not_ready_reason ? el("span", {class: "bad", text: u.not_ready_reason}) : null));
}

function renderNode(n) {  // one node of several sharing an index (--index redis://)
  const box = document.getElementById("node");
  if (!n) { box.replaceChildren(); return; }
  const alive = Object.entries(n.nodes || {}).map(([name, url]) => `${name} (${url})`).join(", ");
  box.replaceChildren(el("div", {class: "kv"},
    el("span", {class: "badge ok", text: "node " + n.node}),
    el("span", {class: "muted", text: `${fmtInt(n.nodes_alive)} nodes alive: ${alive || "–"}`}),
    el("span", {text: `forwarded out ${fmtInt(n.forwarded_out)} · in ${fmtInt(n.forwarded_in)}`
                      + (n.forward_failures ? ` · ${fmtInt(n.forward_failures)} to a node gone` : "")}),
    el("span", {text: `takeovers ${fmtInt(n.takeovers)} (restored ${fmtInt(n.takeover_restored)}, `
                      + `cold ${fmtInt(n.takeover_miss)}, hit ${fmtInt(n.takeover_hit)})`}),
    el("code", {class: "muted", text: n.index || ""})));
}

function secs(s) {
  if (s === null || s === undefined) return "–";
  return s >= 10 ? `${s.toFixed(1)} s` : s >= 1 ? `${s.toFixed(2)} s` : `${(s * 1000).toFixed(0)} ms`;
}

function renderTotals(t) {
  const saved = t.saved_s || {}, avoided = t.tokens_avoided || {};
  document.getElementById("totals").replaceChildren(
    card("requests", fmtInt(t.requests), `${fmtInt(t.turns)} session turns timed by llama-server`),
    card("messages compressed", fmtInt(t.compressed), t.served_whole ? `${fmtInt(t.served_whole)} served whole` : null),
    card("tokens in", fmtInt(t.tokens_in), "new long messages, compressed or served whole"),
    card("tokens served", fmtInt(t.tokens_served), "of those messages"),
    card("tokens saved", fmtInt(t.tokens_saved),
         t.tokens_in ? `${(100 * t.tokens_saved / t.tokens_in).toFixed(0)} % of them, cut by compression` : null),
    card("prefilled / cached", `${fmtInt(t.prefilled_tokens)} / ${fmtInt(t.cached_tokens)}`,
         `prompt tokens (as the engine reported them) · prefill ${secs(t.prefill_s)}`),
    card("time saved (estimate)", `≈ ${secs((saved.compression || 0) + (saved.cache || 0))}`,
         `compression ${secs(saved.compression)} (${fmtInt(avoided.compression)} tokens) · cache ` +
         `${secs(saved.cache)} (${fmtInt(avoided.cache)} tokens)`),
    card("snapshots", fmtInt(t.snapshots), fmtBytes(t.snapshot_bytes)));
  document.getElementById("totals-note").textContent = "Totals since the proxy started. " +
    (t.saved_note ? "Time saved is an " + t.saved_note.replace("this session", "each session") + "." : "");
}

function renderSlots(slots, queued) {
  document.getElementById("queued").textContent = queued ? `(${queued} waiting)` : "";
  const table = document.getElementById("slots");
  table.replaceChildren(row(["slot", "held by", "tokens", "prompt tokens", "state", "snapshot"], true),
    ...slots.map(s => row([String(s.id), s.session ? sessionLink(s.session) : (s.anonymous ? "anonymous" : "empty"),
                           fmtInt(s.tokens), fmtInt(s.prompt_tokens),
                           el("span", {class: "badge " + (s.busy ? "busy" : "idle"), text: s.busy ? "busy" : "idle"}),
                           s.snapshot_current ? "current" : (s.known ? "–" : "unknown content")])));
}

function renderSessions(list, total) {
  document.getElementById("sessions-total").textContent =
    total > list.length ? `(${list.length} most recent of ${fmtInt(total)})` : `(${fmtInt(total)})`;
  const table = document.getElementById("sessions");
  table.replaceChildren(row(["session", "client", "first words", "last activity", "turns", "last turn", "compressed",
                             "tokens in", "served", "saved", "cached", "time saved (est.)", "recalls", "slot",
                             "node", "snapshot"], true),
    ...list.map(s => {
      const v = s.savings || {saved_s: {}, cached_tokens: 0};
      const saved = (v.saved_s.compression || 0) + (v.saved_s.cache || 0);
      return row([sessionLink(s.id), s.client || "–",
                  el("span", {class: "first-words", title: s.first_words || "", text: s.first_words || "–"}),
                  ago(s.last_use), fmtInt(s.turns),
                  s.last_cache ? el("span", {class: "badge cache-" + s.last_cache, text: s.last_cache}) : "–",
                  fmtInt(s.compressed), fmtInt(s.tokens_in), fmtInt(s.tokens_served), fmtInt(s.tokens_saved),
                  fmtInt(v.cached_tokens), v.turns_timed ? "≈ " + secs(saved) : "–",
                  fmtInt(s.recalls), s.slot === null ? "–" : String(s.slot), s.node || "–",
                  s.snapshot ? `${fmtInt(s.snapshot.tokens)} tok · ${fmtBytes(s.snapshot.bytes)}` : "–"]);
    }));
}

async function refresh() {
  try {
    const data = await fetchJSON("/pflash/api/overview");
    renderUpstream(data.upstream);
    renderNode(data.node);
    renderTotals(data.totals);
    renderSlots(data.slots, data.queued);
    renderSessions(data.sessions, data.sessions_total);
    document.getElementById("counters").textContent = JSON.stringify(data.counters, null, 2);
    setStatus("updated " + new Date().toLocaleTimeString());
  } catch (e) {
    setStatus("cannot refresh: " + e.message, true);
  }
}

refresh();
setInterval(refresh, REFRESH_MS);
