// sandtree's web page: the REST API client (/api/v1 with the token of the login form) and small
// DOM helpers. Everything from the server goes into the page as text (el() sets textContent),
// never as markup: commands, outputs and file contents are a tenant's, not the page's.
"use strict";

const API = "/api/v1";
const TOKEN_KEY = "sandtree-token";
const St = {token: sessionStorage.getItem(TOKEN_KEY), who: null, onUnauthorized: null};

class ApiError extends Error {
  constructor(status, body) {
    super(body.message || ("HTTP " + status));
    this.status = status;
    this.code = body.error || "http_" + status;
  }
}

// fetch(API + path) with the token; JSON answers parsed (opts.raw: the Response itself).
async function api(path, opts = {}) {
  const headers = Object.assign({}, opts.headers || {});
  if (St.token) headers.Authorization = "Bearer " + St.token;
  let body = opts.body;
  if (opts.json !== undefined) {
    headers["Content-Type"] = "application/json";
    body = JSON.stringify(opts.json);
  }
  const r = await fetch(API + path, {method: opts.method || "GET", headers, body, cache: "no-store", signal: opts.signal});
  if (!r.ok) {
    let err = {};
    try { err = await r.json(); } catch (e) { /* not JSON: the status says it */ }
    if (r.status === 401 && St.onUnauthorized) St.onUnauthorized();
    throw new ApiError(r.status, err);
  }
  return opts.raw ? r : r.json();
}

// "?a=1&b=2" from an object (undefined and null left out)
function qs(params) {
  const u = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null) u.set(k, v);
  const s = u.toString();
  return s ? "?" + s : "";
}

function enc(ref) { return encodeURIComponent(ref); }

// el("div", {class: "x", onclick: f}, "text", child, ...): children are nodes or text
function el(tag, attrs, ...children) {
  const n = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) n.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(n.dataset, v);
    else n.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    n.append(c instanceof Node ? c : String(c));
  }
  return n;
}

function fmtSeconds(s) {
  if (s === undefined || s === null) return "";
  if (s < 1) return Math.round(s * 1000) + " ms";
  if (s < 120) return s.toFixed(1) + " s";
  return Math.round(s / 60) + " min";
}

function fmtBytes(n) {
  if (n === undefined || n === null) return "";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + " " + u[i];
}

function fmtTime(t) { return t ? new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC" : ""; }

// Text with ANSI SGR colours (ESC [ ... m) as spans of classes ansi-fg-N / ansi-bold; every other
// escape sequence dropped. Returns a DocumentFragment of text nodes and spans.
const ANSI = /\x1b\[([0-9;]*)([A-Za-z])/g;
function ansi(text) {
  const frag = document.createDocumentFragment();
  let fg = null, bold = false, last = 0, m;
  const put = (s) => {
    if (!s) return;
    if (fg === null && !bold) { frag.append(s); return; }
    const span = document.createElement("span");
    span.className = [fg !== null ? "ansi-fg-" + fg : "", bold ? "ansi-bold" : ""].join(" ").trim();
    span.textContent = s;
    frag.append(span);
  };
  ANSI.lastIndex = 0;
  while ((m = ANSI.exec(text)) !== null) {
    put(text.slice(last, m.index));
    last = ANSI.lastIndex;
    if (m[2] !== "m") continue;
    for (const p of (m[1] || "0").split(";").map(Number)) {
      if (p === 0) { fg = null; bold = false; }
      else if (p === 1) bold = true;
      else if (p === 22) bold = false;
      else if (p === 39) fg = null;
      else if (p >= 30 && p <= 37) fg = p - 30;
      else if (p >= 90 && p <= 97) fg = p - 90 + 8;
    }
  }
  put(text.slice(last));
  return frag;
}

// node's children become kids (nested arrays flattened; null, undefined and false left out):
// replaceChildren would show them as the text "null" or "a,b".
function put(node, ...kids) {
  node.replaceChildren();
  for (const c of kids.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    node.append(c instanceof Node ? c : String(c));
  }
}
