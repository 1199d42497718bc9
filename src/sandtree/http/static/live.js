// sandtree's web page: live sandboxes (#live, #live=SID) and the audit log (#audit).
// The list and the buttons are /api/v1/sandboxes calls; the terminal is xterm.js (vendored,
// xterm.js 5.5.0 + addon-fit 0.10.0, MIT: XTERM-LICENSE.txt) over the WebSocket
// /api/v1/sandboxes/{sid}/terminal, the token offered as the subprotocol bearer.<token>.
"use strict";

const Live = {term: null, sock: null, fit: null};

function closeTerminal() {
  if (Live.sock) { Live.sock.onclose = null; Live.sock.close(); }
  if (Live.term) Live.term.dispose();
  Live.sock = Live.term = Live.fit = null;
}

function openTerminal(sid, box) {
  closeTerminal();
  const term = new Terminal({fontSize: 13, cursorBlink: true, scrollback: 2000,
    fontFamily: '"DejaVu Sans Mono", ui-monospace, monospace'});
  const fit = new FitAddon.FitAddon();
  term.loadAddon(fit);
  term.open(box);
  fit.fit();
  const protocols = ["sandtree.terminal"];
  if (St.token) protocols.push("bearer." + St.token);
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const sock = new WebSocket(`${scheme}//${location.host}${API}/sandboxes/${enc(sid)}/terminal${qs({cols: term.cols, rows: term.rows})}`, protocols);
  sock.binaryType = "arraybuffer";
  const utf8 = new TextEncoder();
  sock.onopen = () => { box.dataset.state = "open"; term.focus(); };
  sock.onmessage = (ev) => term.write(typeof ev.data === "string" ? ev.data : new Uint8Array(ev.data));
  sock.onclose = () => { box.dataset.state = "closed"; term.write("\r\n\x1b[2m[the terminal ended]\x1b[0m\r\n"); };
  term.onData((d) => { if (sock.readyState === 1) sock.send(utf8.encode(d)); });
  term.onResize(({cols, rows}) => { if (sock.readyState === 1) sock.send(JSON.stringify({resize: [cols, rows]})); });
  Object.assign(Live, {term, sock, fit});
}

function stateBadge(state) {
  const cls = state === "running" ? "pass" : state === "stopped" ? "none" : state === "hibernated" ? "hib" : "none";
  return el("span", {class: "badge state " + cls}, state);
}

async function sandboxAction(sid, what) {
  if (what === "commit") {
    const r = await api(`/sandboxes/${enc(sid)}/commit`, {method: "POST", json: {}});
    go({tree: r.image, node: r.image});
    return;
  }
  await api(`/sandboxes/${enc(sid)}/${what}`, {method: "POST"});
  await showLive(sid);
}

async function showLive(sid) {
  const h = document.getElementById("home");
  const list = await api(`/sandboxes${qs({all: true})}`);
  list.sort((a, b) => (b.created || 0) - (a.created || 0));
  h.replaceChildren(el("h2", {}, "Live sandboxes"),
    list.length ? el("table", {class: "live"}, el("tr", {}, ["sandbox", "state", "image", "started", ""].map((x) => el("th", {}, x))),
      list.map((s) => el("tr", {class: s.id === sid ? "sel" : null},
        el("td", {}, el("a", {href: "#" + new URLSearchParams({live: s.id}), class: "sid"}, s.id.slice(0, 12))),
        el("td", {}, stateBadge(s.state)), el("td", {}, s.image ? imageLink(s.image) : ""),
        el("td", {}, fmtTime(s.created)))))
      : el("p", {class: "muted"}, "No live sandboxes. Start one from an image's page."));
  h.hidden = false;
  if (!sid) { closeTerminal(); panel().replaceChildren(); return; }
  const s = await api(`/sandboxes/${enc(sid)}`);
  const running = s.state === "running";
  const box = el("div", {id: "terminal"});
  panel().replaceChildren(
    el("h2", {}, "Sandbox ", el("code", {}, s.id.slice(0, 12))),
    kv([["state", stateBadge(s.state)], ["image", s.image ? imageLink(s.image) : null], ["started", fmtTime(s.created)],
      ["tier", s.tier], ["ports", (s.ports || []).map((p) => p.port).join(", ")]]),
    el("div", {class: "actions"}, ["commit", "hibernate", "resume", "stop"].map((what) => el("button", {type: "button",
      id: "sb-" + what, disabled: (what === "resume" ? s.state !== "hibernated" : !running) || null,
      onclick: () => sandboxAction(sid, what).catch(showError)}, what))),
    running ? box : el("p", {class: "muted"}, "The terminal needs a running sandbox."));
  if (running) openTerminal(sid, box); else closeTerminal();
}

async function startSandbox(image) {
  const s = await api("/sandboxes", {method: "POST", json: {image}});
  go({live: s.id});
}

const AUDIT_KEYS = new Set(["seq", "at", "tenant", "token", "action", "image", "result", "op"]);
function auditDetail(r) {
  const rest = Object.entries(r).filter(([k, v]) => !AUDIT_KEYS.has(k) && v !== null && v !== undefined);
  return cut(rest.map(([k, v]) => `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`).join(" "), 140);
}

async function showAudit(q) {
  const h = document.getElementById("home");
  const filters = {tenant: q.get("tenant") || "", action: q.get("action") || "", image: q.get("image") || ""};
  const rows = await api(`/audit${qs({tenant: filters.tenant || null, limit: 500})}`);
  const shown = rows.filter((r) => (!filters.action || r.action === filters.action)
    && (!filters.image || [r.image, r.result].some((i) => i && i.startsWith(filters.image))));
  const form = el("form", {id: "auditform", class: "filters"},
    ["tenant", "action", "image"].map((k) => el("input", {name: k, placeholder: k, value: filters[k]})),
    el("button", {type: "submit"}, "Filter"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const p = {audit: ""};
    for (const k of ["tenant", "action", "image"]) if (form.elements[k].value.trim()) p[k] = form.elements[k].value.trim();
    go(p);
  });
  h.replaceChildren(el("h2", {}, "Audit log"), form, el("table", {class: "audit"},
    el("tr", {}, ["time", "tenant", "action", "image", "result", "detail"].map((x) => el("th", {}, x))),
    shown.map((r) => el("tr", {}, el("td", {}, fmtTime(r.at)), el("td", {}, r.tenant),
      el("td", {}, r.action), el("td", {}, r.image ? imageLink(r.image) : ""), el("td", {}, r.result ? imageLink(r.result) : ""),
      el("td", {class: "detail"}, auditDetail(r))))));
  h.hidden = false;
  panel().replaceChildren();
}
