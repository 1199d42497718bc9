// sandtree's web page: live sandboxes (#live, #live=SID) and the audit log (#audit).
// The list and the buttons are /api/v1/sandboxes calls; the terminal is xterm.js (vendored,
// xterm.js 5.5.0 + addon-fit 0.10.0, MIT: XTERM-LICENSE.txt) over the WebSocket
// /api/v1/sandboxes/{sid}/terminal, the token offered as the subprotocol bearer.<token>.
"use strict";

const Live = {term: null, sock: null, fit: null, follow: null};

// Leaving a live view: its terminal's socket and any followed operation's stream end.
function closeTerminal() {
  if (Live.sock) { Live.sock.onclose = null; Live.sock.close(); }
  if (Live.term) Live.term.dispose();
  if (Live.follow) Live.follow.abort();
  Live.sock = Live.term = Live.fit = Live.follow = null;
}

// An operation's output as it is made: GET /operations/{op}/events (Server-Sent Events, read
// with fetch: EventSource cannot send the token), each stdout/stderr chunk appended as it comes.
async function followOperation(op) {
  const rec = await api(`/operations/${enc(op)}`);
  const out = el("pre", {class: "stream live-out", id: "opout"});
  const status = el("span", {class: "badge", id: "opstatus"}, rec.status);
  const spec = rec.spec || {};
  put(panel(), el("h2", {}, "Operation ", el("code", {}, op.slice(0, 12))),
    el("pre", {class: "command"}, commandText(spec.command !== undefined ? spec.command : spec.source || rec.kind)),
    kv([["status", status], ["image", rec.source ? imageLink(rec.source) : null], ["started", fmtTime(rec.started)]]),
    el("div", {class: "actions"}, el("button", {type: "button", id: "opcancel", disabled: !["queued", "running"].includes(rec.status) || null,
      onclick: () => api(`/operations/${enc(op)}/cancel`, {method: "POST"}).catch(showError)}, "cancel")),
    el("h4", {}, "output"), out);
  const ctl = new AbortController();
  Live.follow = ctl;
  const r = await api(`/operations/${enc(op)}/events`, {raw: true, signal: ctl.signal});
  const reader = r.body.getReader(), dec = new TextDecoder();
  let buf = "";
  const handle = (block) => {
    let kind = "message";
    const data = [];
    for (const line of block.split("\n")) {
      if (line.startsWith("event: ")) kind = line.slice(7);
      else if (line.startsWith("data: ")) data.push(line.slice(6));
      else if (line.startsWith("data:")) data.push(line.slice(5));
    }
    const text = data.join("\n");
    if (kind === "stdout" || kind === "stderr") out.append(el("span", {class: kind}, ansi(text)));
    else if (kind === "start") { status.textContent = "running"; }
    else if (kind === "end") {
      let end = {};
      try { end = JSON.parse(text); } catch (e) { /* keep {} */ }
      status.textContent = end.status + (end.exit_code !== undefined && end.exit_code !== null ? ", exit " + end.exit_code : "");
      status.className = "badge " + (end.status === "done" && !end.exit_code ? "pass" : "fail");
      document.getElementById("opcancel").disabled = true;
      if (end.image) out.after(el("p", {}, "made ", imageLink(end.image)));
    }
  };
  try {
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buf += dec.decode(value, {stream: true});
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) { handle(buf.slice(0, i)); buf = buf.slice(i + 2); }
    }
  } catch (e) {
    if (e.name !== "AbortError") throw e;
  }
}

async function operationsList() {
  const ops = await api(`/operations${qs({limit: 20})}`);
  return ops.length ? el("table", {class: "live ops"}, el("tr", {}, ["operation", "status", "command", "image", "started"].map((x) => el("th", {}, x))),
    ops.map((o) => el("tr", {}, el("td", {}, el("a", {href: "#" + new URLSearchParams({live: "", op: o.id}), class: "opid"}, o.id.slice(0, 12))),
      el("td", {}, el("span", {class: "badge " + (o.status === "done" ? "pass" : o.status === "running" || o.status === "queued" ? "none" : "fail")}, o.status)),
      el("td", {}, el("code", {}, cut(commandText((o.spec || {}).command), 50))), el("td", {}, o.source ? imageLink(o.source) : ""),
      el("td", {}, fmtTime(o.started)))))
    : el("p", {class: "muted"}, "No runs yet.");
}

// xterm.js (290 KB) is loaded the first time a terminal opens, not with every page.
const scripts = {};
function loadScript(src) {
  if (!scripts[src]) {
    scripts[src] = new Promise((ok, fail) => {
      const s = el("script", {src});
      s.onload = ok;
      s.onerror = () => fail(new Error("could not load " + src));
      document.head.append(s);
    });
  }
  return scripts[src];
}

async function openTerminal(sid, box) {
  closeTerminal();
  await loadScript("/ui/xterm.js");
  await loadScript("/ui/xterm-addon-fit.js");
  if (!box.isConnected) return;                     // the view changed while it loaded
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

// End the terminal's shell and wait until the server says it is gone (it closes the socket then):
// hibernate refuses a sandbox while a command (the shell) runs in it.
function endTerminal() {
  const sock = Live.sock;
  if (!sock || sock.readyState !== 1) { closeTerminal(); return Promise.resolve(); }
  return new Promise((done) => {
    const finish = () => { closeTerminal(); done(); };
    sock.onclose = finish;
    setTimeout(finish, 5000);
    sock.send(JSON.stringify({end: true}));
  });
}

async function sandboxAction(sid, what) {
  if (what === "hibernate" || what === "stop") await endTerminal();
  if (what === "commit") {
    const r = await api(`/sandboxes/${enc(sid)}/commit`, {method: "POST", json: {}});
    go({tree: r.image, node: r.image});
    return;
  }
  await api(`/sandboxes/${enc(sid)}/${what}`, {method: "POST"});
  await showLive(sid);
}

async function showLive(sid, op) {
  const h = document.getElementById("home");
  const list = await api(`/sandboxes${qs({all: true})}`);
  const ops = await operationsList();
  list.sort((a, b) => (b.created || 0) - (a.created || 0));
  put(h, el("h2", {}, "Live sandboxes"),
    list.length ? el("table", {class: "live"}, el("tr", {}, ["sandbox", "state", "image", "started", ""].map((x) => el("th", {}, x))),
      list.map((s) => el("tr", {class: s.id === sid ? "sel" : null},
        el("td", {}, el("a", {href: "#" + new URLSearchParams({live: s.id}), class: "sid"}, s.id.slice(0, 12))),
        el("td", {}, stateBadge(s.state)), el("td", {}, s.image ? imageLink(s.image) : ""),
        el("td", {}, fmtTime(s.created)))))
      : el("p", {class: "muted"}, "No live sandboxes. Start one from an image's page."),
    el("h2", {}, "Runs"), ops);
  h.hidden = false;
  closeTerminal();
  if (op) return followOperation(op);
  if (!sid) { put(panel()); return; }
  const s = await api(`/sandboxes/${enc(sid)}`);
  const running = s.state === "running";
  const ports = running ? await api(`/sandboxes/${enc(sid)}/ports`).catch(() => []) : [];
  const openPort = (port) => async () => {        // a signed URL: usable in a new tab without the token
    const r = await api(`/sandboxes/${enc(sid)}/port-url/${port}`, {method: "POST"});
    window.open(r.url, "_blank", "noopener");
  };
  const box = el("div", {id: "terminal"});
  put(panel(),
    el("h2", {}, "Sandbox ", el("code", {}, s.id.slice(0, 12))),
    kv([["state", stateBadge(s.state)], ["image", s.image ? imageLink(s.image) : null], ["started", fmtTime(s.created)],
      ["tier", s.tier], ["network", s.network ? JSON.stringify(s.network) : "off"],
      ["ports", ports.length ? ports.map((p) => el("button", {type: "button", class: "port", onclick: () => openPort(p.port)().catch(showError)}, "open " + p.port)) : null]]),
    el("div", {class: "actions"}, ["commit", "hibernate", "resume", "stop"].map((what) => el("button", {type: "button",
      id: "sb-" + what, disabled: (what === "resume" ? s.state !== "hibernated" : !running) || null,
      onclick: () => sandboxAction(sid, what).catch(showError)}, what))),
    running ? box : el("p", {class: "muted"}, "The terminal needs a running sandbox."));
  if (running) await openTerminal(sid, box);
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
  put(h, el("h2", {}, "Audit log"), form, el("table", {class: "audit"},
    el("tr", {}, ["time", "tenant", "action", "image", "result", "detail"].map((x) => el("th", {}, x))),
    shown.map((r) => el("tr", {}, el("td", {}, fmtTime(r.at)), el("td", {}, r.tenant),
      el("td", {}, r.action), el("td", {}, r.image ? imageLink(r.image) : ""), el("td", {}, r.result ? imageLink(r.result) : ""),
      el("td", {class: "detail"}, auditDetail(r))))));
  h.hidden = false;
  put(panel());
}
