// sandtree's web page: log in, then route on the URL's fragment
//   #tree=REF[&page=N][&node=ID][&files=PATH | &diff=A..B]
// (the tree of REF; a node's page, its files at PATH, or the diff from A to B in the panel);
//   #live[=SID]  live sandboxes (and one's terminal);  #audit[&tenant=T&action=A&image=I]  the audit log.
"use strict";

function showLogin(message) {
  document.getElementById("login").hidden = false;
  document.getElementById("loginerr").textContent = message || "";
  document.getElementById("token").focus();
}

function loggedIn(who) {
  St.who = who;
  document.getElementById("login").hidden = true;
  document.getElementById("who").textContent = who.tenant ? "tenant " + who.tenant : "";
  document.getElementById("logout").hidden = !St.token;
  route().catch(showError);
}

// The landing page: recent runs (what each made), live sandboxes and tags and branches, each a
// link into the tree or the Live view. GET /operations, /sandboxes, /tags, /branches.
const HOME_RUNS = 12;
async function home() {
  const h = document.getElementById("home");
  document.getElementById("tree").classList.add("empty");
  const [tags, branches, runs, boxes] = await Promise.all([api("/tags"), api("/branches"),
    api(`/operations${qs({limit: HOME_RUNS})}`), api("/sandboxes").catch(() => [])]);
  const list = [...Object.entries(branches).map(([n, i]) => ["branch:" + n, i]), ...Object.entries(tags)];
  const treeOf = (o) => "#" + new URLSearchParams(o.result && o.source ? {tree: o.source, node: o.result}
    : {tree: o.result || o.source});
  const runRow = (o) => {
    const x = (o.outcome || {}).exit_code;
    const st = o.status !== "done" ? (o.status === "running" || o.status === "queued" ? "none" : "fail")
      : x === 0 ? "pass" : x === null || x === undefined ? "none" : "fail";
    const cmd = commandText((o.spec || {}).command);
    return el("tr", {},
      el("td", {title: cmd}, el("a", {href: o.result || o.source ? treeOf(o) : "#" + new URLSearchParams({live: "", op: o.id}),
        class: "runcmd"}, el("code", {}, cmd || o.kind))),
      el("td", {}, el("span", {class: "badge " + st}, o.status === "done" && x !== null && x !== undefined ? "exit " + x : o.status)),
      el("td", {}, o.result ? imageLink(o.result) : el("span", {class: "muted"}, "none")),
      el("td", {class: "muted"}, fmtTime(o.started).slice(5, 16)));
  };
  const boxRow = (b) => el("tr", {},
    el("td", {}, el("a", {href: "#" + new URLSearchParams({live: b.id}), class: "sid"}, b.id.slice(0, 12))),
    el("td", {}, stateBadge(b.state)), el("td", {}, b.image ? imageLink(b.image) : ""), el("td", {class: "muted"}, fmtTime(b.created).slice(5, 16)));
  put(h, el("div", {class: "cards"},
    el("section", {class: "card", id: "home-runs"}, el("h2", {}, "Recent runs"),
      runs.length ? el("table", {}, el("tr", {}, ["command", "status", "made", "started"].map((x) => el("th", {}, x))), runs.map(runRow))
        : el("p", {class: "muted"}, "No runs yet."),
      el("a", {href: "#live", class: "more-link"}, "all runs and sandboxes")),
    el("section", {class: "card", id: "home-live"}, el("h2", {}, "Live sandboxes"),
      boxes.length ? el("table", {}, el("tr", {}, ["sandbox", "state", "image", "started"].map((x) => el("th", {}, x))), boxes.map(boxRow))
        : el("p", {class: "muted"}, "No live sandboxes. Start one from an image's page.")),
    el("section", {class: "card", id: "home-refs"}, el("h2", {}, "Tags and branches"),
      el("p", {class: "muted"}, "Pick one to see its lineage tree, or type an image ID above."),
      list.length ? el("ul", {class: "refs"}, list.map(([n, i]) => el("li", {},
        el("a", {href: "#" + new URLSearchParams({tree: n})}, n), " ", el("code", {}, i.slice(0, 12)))))
        : el("p", {class: "muted"}, "No tags or branches yet."))));
  h.hidden = false;
}

let routing = Promise.resolve();
function route() { routing = routing.then(routeNow, routeNow); return routing; }

async function routeNow() {
  const q = new URLSearchParams(location.hash.slice(1));
  const ref = q.get("tree");
  if (!ref) {
    document.getElementById("viewport").replaceChildren();
    Tree.ref = Tree.root = null;
    document.getElementById("treeinfo").textContent = "";
    put(panel());
    document.getElementById("tree").classList.add("empty");
    if (q.has("live")) return showLive(q.get("live"), q.get("op"));
    closeTerminal();
    if (q.has("audit")) return showAudit(q);
    return home();
  }
  closeTerminal();
  document.getElementById("home").hidden = true;
  document.getElementById("tree").classList.remove("empty");
  const refilter = takeFilters(q);
  if (ref === Tree.ref && refilter && Tree.root) { render(); applyView(); }
  if (ref !== Tree.ref) {
    document.getElementById("ref").value = ref;
    try {
      await loadTree(ref, q.get("page"));
    } catch (e) {
      document.getElementById("viewport").replaceChildren();
      Tree.ref = Tree.root = null;
      document.getElementById("treeinfo").textContent = "";
      showError(e);
      return;
    }
  }
  const node = q.get("node") || (Tree.root && Tree.root.image);
  if (node && (!Tree.selected || Tree.selected.image !== node)) selectImage(node);
  if (q.get("diff")) {
    const [a, b] = q.get("diff").split("..");
    return showDiff(a, b, q.has("split"));
  }
  if (q.get("files")) return showFiles(node, q.get("files"));
  const hint = Tree.selected && Tree.selected.image === node ? Tree.selected.op : null;
  return showNode(node, hint);
}

async function start() {
  initTreeEvents();
  St.onUnauthorized = () => showLogin(St.token ? "The token was refused." : "");
  Tree.onSelect = (n) => go({tree: Tree.ref, node: n.image});
  Tree.onCompare = (a, b) => go({tree: Tree.ref, node: b, diff: a + ".." + b});
  document.getElementById("loginform").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    St.token = document.getElementById("token").value.trim();
    try {
      const who = await api("/whoami");
      sessionStorage.setItem(TOKEN_KEY, St.token);
      document.getElementById("token").value = "";
      loggedIn(who);
    } catch (e) {
      St.token = null;
      showLogin(e.status === 401 ? "That token was refused." : String(e.message));
    }
  });
  document.getElementById("logout").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    St.token = null;
    location.hash = "";
    location.reload();
  });
  document.getElementById("refform").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const ref = document.getElementById("ref").value.trim();
    if (ref) { Tree.ref = null; go({tree: ref}); }
  });
  window.addEventListener("hashchange", () => route().catch(showError));
  window.addEventListener("resize", () => { if (Tree.root) keepInView(); if (Live.fit) Live.fit.fit(); });
  try {
    loggedIn(await api("/whoami"));
  } catch (e) {
    if (e.status !== 401) showError(e);
  }
}

document.addEventListener("DOMContentLoaded", start);
