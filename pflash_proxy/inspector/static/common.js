// Shared helpers of the inspector pages. Text from sessions is only ever set with textContent, never as HTML.
"use strict";

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function fmtInt(n) {
  return n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US");
}

function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return (i ? n.toFixed(1) : String(n)) + " " + units[i];
}

function fmtScore(s) {
  if (s === null || s === undefined) return "–";
  return s >= 10 ? s.toFixed(0) : String(Number(s.toPrecision(2)));
}

function ago(epoch) {
  if (!epoch) return "–";
  const s = Math.max(0, Date.now() / 1000 - epoch);
  if (s < 60) return Math.round(s) + " s ago";
  if (s < 3600) return Math.round(s / 60) + " min ago";
  if (s < 86400) return (s / 3600).toFixed(1) + " h ago";
  return (s / 86400).toFixed(1) + " d ago";
}

// Score (relative to the message's best unit, square root so middling scores show) to a colour: pale yellow (0)
// to deep red (the best).
function heatColour(score, max) {
  const t = max > 0 ? Math.sqrt(Math.min(1, Math.max(0, score / max))) : 0;
  const hue = 52 - 48 * t, light = 93 - 45 * t, sat = 70 + 25 * t;
  return `hsl(${hue.toFixed(0)}, ${sat.toFixed(0)}%, ${light.toFixed(0)}%)`;
}

async function fetchJSON(url) {
  const resp = await fetch(url, {headers: {"Accept": "application/json"}, cache: "no-store"});
  let body = null;
  try { body = await resp.json(); } catch (e) { body = null; }
  if (!resp.ok) {
    const msg = body && body.error ? body.error.message : resp.statusText;
    throw new Error(`${resp.status}: ${msg}`);
  }
  return body;
}

function card(label, value, sub) {
  return el("div", {class: "card"}, el("div", {class: "card-label", text: label}),
            el("div", {class: "card-value", text: value}), sub ? el("div", {class: "card-sub", text: sub}) : null);
}

function setStatus(text, bad) {
  const s = document.getElementById("status");
  s.textContent = text;
  s.classList.toggle("bad", !!bad);
}
