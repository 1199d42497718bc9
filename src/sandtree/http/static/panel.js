// sandtree's web page: the side panel. A node's page (the run that made it, its parents and
// children, tags), the file browser of an image (ls, read, download) and the diff between two
// images. Each is a few /api/v1 calls; the answers go in as text (el(), ansi()).
"use strict";

const READ_LIMIT = 1 << 20;        // bytes of a file shown in the page (the download is whole)

function panel() { return document.getElementById("panel"); }

// (a tree's filters go along: tree.js filterParams)
function go(params) { location.hash = new URLSearchParams(params.tree ? {...params, ...filterParams()} : params).toString(); }

function imageLink(id, text) {
  return el("a", {href: "#" + new URLSearchParams({tree: Tree.ref || id, node: id}).toString(), class: "img"},
    text || id.slice(0, 12));
}

function showError(e) {
  const p = panel();
  put(p, el("p", {class: "err", role: "alert"}, e.status === 404 ? "Not found: " + e.message : String(e.message || e)));
}

function kv(rows) {
  return el("table", {class: "kv"}, rows.filter((r) => r[1] !== undefined && r[1] !== null && r[1] !== "")
    .map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, v))));
}

function outputBlock(name, full, head, bytes, truncated) {
  const text = full !== undefined && full !== null ? full : (head || "");
  const note = [];
  if (full === undefined || full === null) {
    if (bytes !== undefined && bytes > text.length) note.push(`first ${fmtBytes(text.length)} of ${fmtBytes(bytes)} kept`);
  }
  if (truncated) note.push("cut at the run's output limit");
  return el("div", {class: "out"}, el("h4", {}, name, note.length ? el("small", {}, " (" + note.join("; ") + ")") : null),
    el("pre", {class: "stream " + name}, text ? ansi(text) : el("i", {}, "(empty)")));
}

function runSection(op) {
  const spec = op.spec || {}, o = op.outcome || {};
  const dur = op.finished && op.started ? op.finished - op.started : null;
  const cmd = spec.command !== undefined ? commandText(spec.command) : (spec.source || op.kind);
  const st = o.exit_code === undefined || o.exit_code === null ? "none" : o.exit_code === 0 ? "pass" : "fail";
  const env = spec.env && Object.keys(spec.env).length
    ? el("table", {class: "env"}, Object.entries(spec.env).map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, String(v)))))
    : null;
  const lim = spec.limits ? Object.entries(spec.limits).filter(([, v]) => v !== null).map(([k, v]) =>
    k === "memory" || k === "disk" || k === "output" ? `${k} ${fmtBytes(v)}` : `${k} ${v}`).join(", ") : null;
  const u = o.usage || {};
  const usage = o.usage ? [u.wall_s !== undefined ? "wall " + fmtSeconds(u.wall_s) : null,
    u.user_cpu_s !== undefined ? "cpu " + fmtSeconds((u.user_cpu_s || 0) + (u.sys_cpu_s || 0)) : null,
    u.max_rss_bytes ? "max rss " + fmtBytes(u.max_rss_bytes) : null,
    u.cgroup_memory_peak_bytes ? "memory peak " + fmtBytes(u.cgroup_memory_peak_bytes) : null].filter(Boolean).join(", ") : null;
  return el("section", {class: "run"},
    el("h3", {}, "Made by ", el("span", {class: "kind"}, op.kind), " ", el("code", {class: "opid"}, op.id.slice(0, 12))),
    el("pre", {class: "command"}, cmd),
    kv([["status", el("span", {class: "badge " + st}, op.status + (o.exit_code !== undefined && o.exit_code !== null ? ", exit " + o.exit_code : ""))],
      ["signal", o.signal], ["timed out", o.timed_out ? "yes" : null], ["killed (memory)", o.oom_killed ? "yes" : null],
      ["duration", dur !== null ? fmtSeconds(dur) : null], ["started", fmtTime(op.started)],
      ["tier", spec.tier], ["cwd", spec.cwd], ["user", spec.uid !== undefined ? `${spec.uid}:${spec.gid}` : null],
      ["limits", lim], ["network", spec.network ? JSON.stringify(spec.network) : (op.kind === "run" ? "off" : null)],
      ["usage", usage], ["message", o.message]]),
    env ? el("h4", {}, "Environment (secrets masked)") : null, env,
    op.kind === "run" || op.kind === "exec" ? [
      outputBlock("stdout", op.stdout, o.stdout_head, o.stdout_bytes, o.stdout_truncated),
      outputBlock("stderr", op.stderr, o.stderr_head, o.stderr_bytes, o.stderr_truncated)] : null);
}

function edgeRow(e, other, id) {
  const st = e.exit_code === null || e.exit_code === undefined ? "none" : e.exit_code === 0 ? "pass" : "fail";
  return el("li", {}, imageLink(e[other]), " ", el("span", {class: "badge " + st}, e.kind || ""), " ",
    el("code", {class: "cmd"}, cut(commandText(e.command), 60)),
    other === "parent" ? el("button", {type: "button", class: "diffparent", onclick: () => go({tree: Tree.ref || id, node: id, diff: e.parent + ".." + id})}, "diff") : null);
}

async function showNode(id, opHint) {
  const p = panel();
  put(p, el("p", {class: "muted"}, "loading " + id.slice(0, 12) + "…"));
  const [info, made, parents, children] = await Promise.all([api(`/images/${enc(id)}`),
    api(`/images/${enc(id)}/produced-by`), api(`/images/${enc(id)}/parents`), api(`/images/${enc(id)}/children`)]);
  const pick = made.find((m) => m.op === opHint) || made[0];
  const op = pick ? await api(`/operations/${enc(pick.op)}`) : null;
  const node = Tree.byImage.get(id);
  const names = node && node.n ? node.n.names : info.tags || [];
  const picked = sessionStorage.getItem("sandtree-pick");
  put(p,
    el("h2", {}, "Image ", el("code", {class: "imageid"}, info.id.slice(0, 12))),
    el("p", {class: "fullid"}, info.id),
    el("p", {class: "names"}, names.length ? names.map((n) => el("span", {class: "tag"}, n)) : el("span", {class: "muted"}, "no tags")),
    kv([["size", fmtBytes(info.size)], ["files", info.files], ["created", fmtTime(info.created)],
      ["score", info.annotations && info.annotations.score !== null ? el("span", {class: "scoreval"}, fmtScore(info.annotations.score)) : null],
      ["annotations", info.annotations && Object.keys(info.annotations.meta || {}).length
        ? el("code", {class: "annotations"}, Object.entries(info.annotations.meta).map(([k, v]) => `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`).join("; "))
        : null]]),
    el("div", {class: "actions"},
      el("button", {type: "button", id: "browse", onclick: () => go({tree: Tree.ref || id, node: id, files: "/"})}, "Browse files"),
      el("button", {type: "button", id: "pick", onclick: () => { sessionStorage.setItem("sandtree-pick", id); showNode(id, opHint).catch(showError); }}, "Pick for diff"),
      picked && picked !== id ? el("button", {type: "button", id: "diffpicked",
        onclick: () => go({tree: Tree.ref || id, node: id, diff: picked + ".." + id})}, "Diff from picked " + picked.slice(0, 12)) : null,
      el("button", {type: "button", id: "subtree", onclick: () => go({tree: id, node: id})}, "Tree from here"),
      el("button", {type: "button", id: "startsb", onclick: () => startSandbox(id).catch(showError)}, "Start a sandbox")),
    actionForm(id),
    el("div", {class: "actions"}, names.filter((n) => n.startsWith("branch:")).map((n) => el("button", {type: "button",
      class: "rollback", onclick: () => rollback(n.slice(7)).catch(showError)}, `roll back ${n} one step`))),
    op ? runSection(op) : el("p", {class: "muted"}, "No operation record visible for this image."),
    el("h3", {}, "Parents"), parents.length ? el("ul", {class: "edges"}, parents.map((e) => edgeRow(e, "parent", id))) : el("p", {class: "muted"}, "none (a root)"),
    el("h3", {}, "Children"), children.length ? el("ul", {class: "edges"}, children.map((e) => edgeRow(e, "child", id))) : el("p", {class: "muted"}, "none"));
}

// an ls/stat entry's type ("file", "dir", "symlink", ...) and octal mode ("0644") as ls -l shows them
async function rollback(branch) {
  const r = await api(`/branches/${enc(branch)}/rollback`, {method: "POST", json: {steps: 1}});
  Tree.ref = null;
  go({tree: new URLSearchParams(location.hash.slice(1)).get("tree") || r.image, node: r.image});
}

// Tag it, start a branch at it, or run commands on it (one line: POST /runs, a new child; several
// lines: POST /fork, a branch each, in parallel): the API's own calls.
function actionForm(id) {
  const input = el("textarea", {id: "actinput", rows: 2, placeholder: "tag or branch name; or commands, one per line",
    "aria-label": "name or commands"});
  const msg = el("span", {class: "muted", id: "actmsg"});
  const act = (what) => async () => {
    const v = input.value.trim();
    if (!v) return;
    msg.textContent = "…";
    try {
      if (what === "tag") await api(`/tags/${enc(v)}`, {method: "PUT", json: {image: id}});
      else if (what === "branch") await api("/branches", {method: "POST", json: {name: v, image: id}});
      else {
        const lines = v.split("\n").map((l) => l.trim()).filter(Boolean);
        let made = null;
        if (lines.length > 1) await api("/fork", {method: "POST", json: {image: id, commands: lines}});
        else {
          const rec = await api("/runs", {method: "POST", json: {image: id, command: lines[0]}});
          made = rec.result && rec.result !== id ? rec.result : null;
        }
        Tree.ref = null;                                   // redraw the tree with the new child
        const to = new URLSearchParams({tree: new URLSearchParams(location.hash.slice(1)).get("tree") || id, node: made || id});
        if ("#" + to.toString() === location.hash) await route(); else location.hash = to.toString();
        return;
      }
      Tree.ref = null;                                     // redraw: the node shows its new name
      await route();
      const now = document.getElementById("actmsg");
      if (now) now.textContent = `${what} ${v}: done`;
    } catch (e) { msg.textContent = e.message; msg.className = "err"; }
  };
  return el("div", {class: "actions actform"}, input,
    el("button", {type: "button", id: "act-tag", onclick: act("tag")}, "Tag"),
    el("button", {type: "button", id: "act-branch", onclick: act("branch")}, "Branch"),
    el("button", {type: "button", id: "act-run", onclick: act("run")}, "Run"), msg);
}

function modeString(type, mode) {
  mode = parseInt(mode || "0", 8);
  const t = {dir: "d", symlink: "l", file: "-", char: "c", block: "b", fifo: "p", socket: "s"}[type] || "?";
  let s = t;
  for (let i = 8; i >= 0; i--) s += (mode >> i) & 1 ? "rwx"[(8 - i) % 3] : "-";
  return s;
}

function joinPath(dir, name) { return (dir.endsWith("/") ? dir : dir + "/") + name; }

async function showFiles(id, path) {
  const p = panel();
  let st;
  try { st = path === "/" ? {type: "dir"} : await api(`/images/${enc(id)}/stat${qs({path})}`); } catch (e) { showError(e); return; }
  const crumbs = el("p", {class: "crumbs"}, imageLink(id), " ");
  const parts = path.split("/").filter(Boolean);
  crumbs.append(el("a", {href: "#" + new URLSearchParams({tree: Tree.ref || id, node: id, files: "/"})}, "/"));
  parts.forEach((part, i) => {
    const to = "/" + parts.slice(0, i + 1).join("/");
    crumbs.append(el("a", {href: "#" + new URLSearchParams({tree: Tree.ref || id, node: id, files: to})}, part), i < parts.length - 1 ? "/" : "");
  });
  if (st.type === "dir") {
    const entries = await api(`/images/${enc(id)}/ls${qs({path})}`);
    entries.sort((a, b) => (a.type !== "dir") - (b.type !== "dir") || a.name.localeCompare(b.name));
    put(p, el("h2", {}, "Files"), crumbs,
      el("button", {type: "button", id: "downloadtar", onclick: () => download(id, path, true).catch(showError)}, "Download as tar"),
      el("table", {class: "files"},
      el("tr", {}, el("th", {}, "mode"), el("th", {}, "size"), el("th", {}, "name")),
      entries.map((e) => el("tr", {}, el("td", {class: "mode"}, modeString(e.type, e.mode)), el("td", {class: "size"}, e.type === "file" ? fmtBytes(e.size) : ""),
        el("td", {}, el("a", {href: "#" + new URLSearchParams({tree: Tree.ref || id, node: id, files: joinPath(path, e.name)}), class: "entry " + e.type},
          e.name + (e.type === "dir" ? "/" : "")), e.type === "symlink" ? el("span", {class: "muted"}, " → " + e.target) : null)))));
    return;
  }
  const info = kv([["type", st.type], ["size", fmtBytes(st.size)], ["mode", modeString(st.type, st.mode) + " (" + st.mode + ")"],
    ["owner", `${st.uid}:${st.gid}`], ["target", st.target], ["sha256", st.sha256]]);
  let body;
  if (st.type !== "file") body = el("p", {class: "muted"}, "not a regular file");
  else {
    const r = await api(`/images/${enc(id)}/read${qs({path, limit: READ_LIMIT})}`, {raw: true});
    const bytes = new Uint8Array(await r.arrayBuffer());
    let text = null;
    try { text = new TextDecoder("utf-8", {fatal: true}).decode(bytes); } catch (e) { text = null; }
    if (text !== null && text.includes("\0")) text = null;
    body = text === null ? el("p", {class: "binary"}, `binary file, ${fmtBytes(st.size)}`)
      : el("pre", {class: "filetext"}, highlight(path, text) || text, st.size > READ_LIMIT ? el("i", {}, `\n… (first ${fmtBytes(READ_LIMIT)} of ${fmtBytes(st.size)})`) : null);
  }
  put(p, el("h2", {}, "File"), crumbs, info,
    st.type === "file" ? el("button", {type: "button", id: "download", onclick: () => download(id, path).catch(showError)}, "Download") : null, body);
}

// A file's bytes, or (tar) a directory as a tar: fetched with the token, saved from a blob URL.
async function download(id, path, tar) {
  const r = await api(`/images/${enc(id)}/${tar ? "export" : "read"}${qs({path})}`, {raw: true});
  const url = URL.createObjectURL(await r.blob());
  const base = path.split("/").filter(Boolean).pop() || id.slice(0, 12);
  const a = el("a", {href: url, download: tar ? base + ".tar" : base});
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

function patchView(patch) {
  const files = [];
  for (const line of patch.split("\n")) {
    if (line.startsWith("diff ")) files.push({head: line, lines: []});
    else if (files.length) files[files.length - 1].lines.push(line);
  }
  return files.map((f) => el("div", {class: "patchfile"},
    el("pre", {class: "patch"}, el("div", {class: "phead"}, f.head), f.lines.map((l) => el("div", {
      class: l.startsWith("+++") || l.startsWith("---") ? "phead" : l.startsWith("@@") ? "hunk" : l.startsWith("+") ? "add" : l.startsWith("-") ? "del" : "ctx"}, l || " ")))));
}

// The patch side by side: per file, removed lines left and added lines right, paired in order
// within each run of changes; context on both sides.
function splitView(patch) {
  const files = [];
  for (const line of patch.split("\n")) {
    if (line.startsWith("diff ")) files.push({head: line, rows: [], dels: [], adds: []});
    else if (!files.length || line.startsWith("+++") || line.startsWith("---")) continue;
    else {
      const f = files[files.length - 1];
      const flush = () => {
        for (let i = 0; i < Math.max(f.dels.length, f.adds.length); i++) f.rows.push([f.dels[i], f.adds[i]]);
        f.dels = []; f.adds = [];
      };
      if (line.startsWith("-")) f.dels.push(line.slice(1));
      else if (line.startsWith("+")) { f.adds.push(line.slice(1)); }
      else { flush(); f.rows.push(line.startsWith("@@") ? ["@@", line] : [line.slice(1), line.slice(1), true]); }
    }
  }
  for (const f of files) for (let i = 0; i < Math.max(f.dels.length, f.adds.length); i++) f.rows.push([f.dels[i], f.adds[i]]);
  return files.map((f) => el("table", {class: "split"}, el("tr", {}, el("th", {colspan: 2, class: "phead"}, f.head)),
    f.rows.map(([l, r, same]) => l === "@@" ? el("tr", {class: "hunk"}, el("td", {colspan: 2}, r))
      : el("tr", {}, el("td", {class: same ? "ctx" : l === undefined ? "gap" : "del"}, l === undefined ? "" : l),
        el("td", {class: same ? "ctx" : r === undefined ? "gap" : "add"}, r === undefined ? "" : r)))));
}

async function showDiff(a, b, split) {
  const p = panel();
  put(p, el("p", {class: "muted"}, "diffing…"));
  const d = await api(`/diff${qs({a, b, patch: true})}`);
  const here = new URLSearchParams(location.hash.slice(1));
  split ? here.delete("split") : here.set("split", "1");
  put(p, el("h2", {}, "Diff"), el("p", {}, imageLink(d.a), " → ", imageLink(d.b), " ",
    el("a", {href: "#" + here.toString(), id: "splittoggle"}, split ? "unified" : "side by side")),
    el("h3", {}, `${d.changes.length} changed`),
    el("ul", {class: "changes"}, d.changes.map((c) => el("li", {}, el("span", {class: "badge " + c.kind}, c.kind), " ", el("code", {}, c.path)))),
    el("div", {class: "actions"}, el("button", {type: "button", id: "previewmerge",
      onclick: () => showMergePreview(d.a, d.b).catch(showError)}, "Preview merging these two")),
    el("div", {id: "mergepreview"}),
    el("h3", {}, "Patch"), d.patch ? el("div", {class: "patches"}, split ? splitView(d.patch) : patchView(d.patch))
      : el("p", {class: "muted"}, "no text changes"));
}

// GET /merge/preview: what merging theirs into ours would make (nothing is made); conflicted
// text files shown with their markers highlighted; then the merge itself, POST /merge.
async function showMergePreview(ours, theirs) {
  const box = document.getElementById("mergepreview");
  put(box, el("p", {class: "muted"}, "previewing…"));
  const p = await api(`/merge/preview${qs({ours, theirs})}`);
  const merge = (strategy) => async () => {
    const r = await api("/merge", {method: "POST", json: {base: p.base, ours, theirs, strategy}});
    Tree.ref = null;
    go({tree: new URLSearchParams(location.hash.slice(1)).get("tree") || r.image, node: r.image});
  };
  const button = (label, strategy) => el("button", {type: "button", class: "domerge", dataset: {strategy: strategy || "none"},
    onclick: () => merge(strategy)().catch(showError)}, label);
  put(box, el("h3", {}, "Merge preview"),
    el("p", {}, p.clean ? el("span", {class: "badge pass", id: "mergeclean"}, "clean") : el("span", {class: "badge fail", id: "mergeconflicts"},
      `${p.conflicts.length} conflict${p.conflicts.length === 1 ? "" : "s"}`), " from base ", p.base ? imageLink(p.base) : "none"),
    p.conflicts.length ? el("ul", {class: "changes"}, p.conflicts.map((c) => el("li", {}, el("span", {class: "badge fail"}, c.kind), " ", el("code", {}, c.path)))) : null,
    p.marked.map((f) => el("div", {class: "patchfile"}, el("pre", {class: "patch marked"}, el("div", {class: "phead"}, f.path),
      f.text.split("\n").map((l) => el("div", {class: /^(<{7}|={7}|>{7}|\|{7})/.test(l) ? "marker" : "ctx"}, l || " "))))),
    el("div", {class: "actions"}, p.clean ? button("Merge", null)
      : [button("Merge keeping conflict markers", "markers"), button("Merge taking ours", "ours"), button("Merge taking theirs", "theirs")]));
}
