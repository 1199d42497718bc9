// sandtree's web page: the lineage tree view (an SVG drawn by hand, no library).
// Data: GET /api/v1/images/{ref}/lineage (branching/lineage.py's tree: nested nodes, each with the
// edge that made it: op, command, exit_code, seconds; `repeat` marks a merge's second parent,
// `more`/`cut` a node whose children were not sent). Nodes are images, edges are labelled by
// command, exit code and duration and coloured pass/fail; runs of 3+ unnamed single-child images
// collapse into one "N steps" pill (click to open); a `+` on a node loads its subtree (lazy);
// a merge's second parent gets a dashed edge to the merged image; wheel zooms, drag pans.
// A node shows its score and numeric annotations (the tree's `score`, `metrics`), and "▶ live" when
// fork_from can start sandboxes from its live state (the tree's `live`). Filters (exit
// status, tag, command text) keep the matching images and the way to them. Shift+click (or the
// "compare" button, then two clicks) picks two images to diff. Zoomed out, the edge labels give
// way to one label per node at a readable size (some give way where rows are too close), and past
// MINIMAP_AT drawn images a minimap shows the whole tree and where the window is on it.
"use strict";

const SVGNS = "http://www.w3.org/2000/svg";
const COL = 300, ROW = 56, NODE_W = 150, NODE_H = 36, MIN_CHAIN = 3, LABEL_CHARS = 22;
const TREE_PAGE = 1000;          // nodes per lineage request (first paint, and each `+`); #...&page=N sets another
const FAR = 0.5;                 // below this zoom the drawing switches to far labels
const FAR_FONT = 12;             // far labels' size on the screen, px
const MINIMAP_AT = 50;           // drawn images past which the minimap shows

const Tree = {
  ref: null, root: null, shown: [], byImage: new Map(), expanded: new Set(), expandAll: false,
  selected: null, view: {k: 1, tx: 20, ty: 20}, onSelect: null, loaded: 0, page: TREE_PAGE,
  filter: {status: "", tag: "", text: ""}, matched: null, picks: [], comparing: false, onCompare: null, farK: 0,
};

function svgEl(tag, attrs, text) {
  const n = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) n.setAttribute(k, v);
  if (text !== undefined) n.textContent = text;
  return n;
}

function cut(s, n) { s = s === null || s === undefined ? "" : String(s); return s.length > n ? s.slice(0, n - 1) + "…" : s; }

function commandText(c) { return Array.isArray(c) ? c.join(" ") : (c === null || c === undefined ? "" : String(c)); }

// API nodes -> internal nodes {image, short, names, op, command, exit_code, seconds, repeat, more, cut, kids, parent}
function adopt(data, parent) {
  const mk = (d, p) => ({image: d.image, short: d.short || d.image.slice(0, 12), names: d.names || [], op: d.op,
    command: commandText(d.command), exit_code: d.exit_code, seconds: d.seconds, repeat: !!d.repeat,
    more: !!d.more, cut: !!d.cut, live: !!d.live, score: d.score, metrics: d.metrics || {}, kids: [], parent: p});
  const top = mk(data, parent);
  const stack = [[data, top]];
  let count = 1;
  while (stack.length) {
    const [d, n] = stack.pop();
    for (const c of d.children || []) {
      const k = mk(c, n);
      n.kids.push(k);
      count++;
      stack.push([c, k]);
    }
  }
  Tree.loaded += count;
  return top;
}

function status(n) { return n.exit_code === null || n.exit_code === undefined ? "none" : n.exit_code === 0 ? "pass" : "fail"; }

function fmtScore(v) { return typeof v === "number" ? String(Number(v.toPrecision(3))) : String(v); }

function metricsText(n) { return Object.entries(n.metrics).map(([k, v]) => k + " " + fmtScore(v)).join(" · "); }

function filtering() { const f = Tree.filter; return !!(f.status || f.tag || f.text); }

// The filters live in the page's address too (#tree=...&status=fail&tag=...&text=...), so a
// filtered view survives a reload and can be linked; a node clicked keeps them (panel.js go).
const FILTER_KEYS = ["status", "tag", "text"];
function filterParams() {
  return Object.fromEntries(FILTER_KEYS.filter((k) => Tree.filter[k]).map((k) => [k, Tree.filter[k]]));
}
// From the address (q: its URLSearchParams) into the form and Tree.filter; whether they changed.
function takeFilters(q) {
  const form = document.getElementById("filters");
  let changed = false;
  for (const k of FILTER_KEYS) {
    const v = (q.get(k) || "").trim();
    if (form.elements[k].value !== v) form.elements[k].value = v;
    if (Tree.filter[k] !== v) { Tree.filter[k] = v; changed = true; }
  }
  return changed;
}

// Whether a node passes every filter set: its edge's exit status, a tag or branch name holding
// the tag text, its command holding the command text (both case-insensitive).
function matches(n) {
  const f = Tree.filter;
  if (f.status && status(n) !== f.status) return false;
  if (f.tag && !n.names.some((x) => x.toLowerCase().includes(f.tag.toLowerCase()))) return false;
  if (f.text && !n.command.toLowerCase().includes(f.text.toLowerCase())) return false;
  return true;
}

// With a filter set: the matching nodes (Tree.matched) and, to draw, them and their ancestors.
function keptNodes() {
  Tree.matched = null;
  if (!filtering() || !Tree.root) return null;
  const keep = new Set([Tree.root]), matched = new Set(), stack = [Tree.root];
  while (stack.length) {
    const n = stack.pop();
    if (!n.repeat && matches(n)) {
      matched.add(n);
      for (let a = n; a && !keep.has(a); a = a.parent) keep.add(a);
    }
    for (const k of n.kids) stack.push(k);
  }
  Tree.matched = matched;
  return keep;
}

function kidsOf(n, keep) { return keep ? n.kids.filter((k) => keep.has(k) || (k.repeat && keep.has(k.parent))) : n.kids; }

function collapsible(n, keep) {
  const kids = kidsOf(n, keep);
  return !Tree.expandAll && kids.length === 1 && !kids[0].repeat && n.names.length === 0 && !n.more
    && !n.cut && n !== Tree.selected && !(Tree.matched && Tree.matched.has(n)) && !Tree.picks.includes(n.image);
}

// The drawn tree: display nodes {n | chain, kids, edge, depth}; merges: dashed extra edges.
function build(root) {
  const keep = keptNodes();
  const droot = {n: root, kids: [], edge: null, depth: 0};
  const merges = [], stack = [droot];
  while (stack.length) {
    const d = stack.pop();
    for (const c of kidsOf(d.n, keep)) {
      if (c.repeat) { merges.push({from: d, edge: c}); continue; }
      const chain = [];
      let cur = c;
      if (!Tree.expanded.has(c.image)) while (collapsible(cur, keep)) { chain.push(cur); cur = kidsOf(cur, keep)[0]; }
      if (chain.length >= MIN_CHAIN) {
        const pill = {chain, kids: [], depth: d.depth + 1,
          edge: {command: chain[0].command + " …", exit_code: chain.some((x) => status(x) === "fail") ? 1 : chain.every((x) => status(x) === "pass") ? 0 : null,
            seconds: chain.reduce((a, x) => a + (x.seconds || 0), 0), steps: chain.length}};
        const nd = {n: cur, kids: [], edge: cur, depth: d.depth + 2};
        pill.kids.push(nd);
        d.kids.push(pill);
        stack.push(nd);
      } else {
        const nd = {n: c, kids: [], edge: c, depth: d.depth + 1};
        d.kids.push(nd);
        stack.push(nd);
      }
    }
  }
  return {droot, merges};
}

// Rows: leaves top to bottom in depth-first order; a parent midway between its first and last child.
function layout(droot) {
  const order = [], stack = [droot];
  let row = 0;
  while (stack.length) {
    const d = stack.pop();
    order.push(d);
    d.x = d.depth * COL;
    if (!d.kids.length) d.y = (row++) * ROW;
    for (let i = d.kids.length - 1; i >= 0; i--) stack.push(d.kids[i]);
  }
  for (let i = order.length - 1; i >= 0; i--) {
    const d = order[i];
    if (d.kids.length) d.y = (d.kids[0].y + d.kids[d.kids.length - 1].y) / 2;
  }
  return {order, rows: Math.max(row, 1)};
}

function edgeLabel(g, x, y, e) {
  const st = status(e);
  g.append(svgEl("text", {x: x - 8, y: y - 7, class: "elabel", "text-anchor": "end"}, cut(e.command, LABEL_CHARS)));
  const bits = [];
  if (e.exit_code !== null && e.exit_code !== undefined) bits.push((st === "pass" ? "✓ " : "✗ ") + "exit " + e.exit_code);
  if (e.seconds) bits.push(fmtSeconds(e.seconds));
  if (bits.length) g.append(svgEl("text", {x: x - 8, y: y + 14, class: "estat " + st, "text-anchor": "end"}, bits.join(" · ")));
}

function render() {
  const vp = document.getElementById("viewport");
  const t0 = performance.now();
  const {droot, merges} = build(Tree.root);
  const {order, rows} = layout(droot);
  Tree.shown = order;
  Tree.byImage = new Map();
  const edges = svgEl("g", {class: "edges"}), nodes = svgEl("g", {class: "nodes"}), labels = svgEl("g", {class: "labels"});
  order.forEach((d, i) => { d.i = i; });
  order.forEach((d, i) => {
    if (d.n) Tree.byImage.set(d.n.image, d);
    for (const k of d.kids) {
      const x1 = d.x + NODE_W, y1 = d.y, x2 = k.x, y2 = k.y, mx = (x1 + x2) / 2;
      edges.append(svgEl("path", {d: `M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2},${y2}`, class: "edge " + status(k.edge),
        "data-to": k.i}));
      edgeLabel(labels, x2, y2, k.edge);
    }
    const g = svgEl("g", {class: "node" + (d.chain ? " chain" : ""), transform: `translate(${d.x},${d.y - NODE_H / 2})`, "data-i": i});
    if (d.chain) {
      g.append(svgEl("rect", {width: NODE_W, height: NODE_H, rx: 18}));
      g.append(svgEl("text", {x: NODE_W / 2, y: 23, "text-anchor": "middle", class: "steps"}, "⋯ " + d.chain.length + " steps"));
      d.far = "⋯ " + d.chain.length + " steps";
      g.append(svgEl("title", {}, "collapsed: click to show each step"));
    } else {
      const n = d.n, metrics = metricsText(n);
      g.setAttribute("data-image", n.image);
      if (n === Tree.selected) g.classList.add("sel");
      if (Tree.matched) g.classList.add(Tree.matched.has(n) ? "match" : "dim");
      g.append(svgEl("rect", {width: NODE_W, height: NODE_H, rx: 5}));
      g.append(svgEl("text", {x: 8, y: 15, class: "short"}, n.short));
      g.append(svgEl("text", {x: 8, y: 29, class: "names"}, cut(n.names.join(" "), 24)));
      if (metrics) g.append(svgEl("text", {x: 8, y: NODE_H + 10, class: "metrics"}, cut(metrics, 28)));
      if (n.live) {     // a live state: fork_from starts sandboxes that go on from its processes
        g.classList.add("live");
        g.append(svgEl("text", {x: NODE_W - 6, y: 29, class: "live", "text-anchor": "end", "data-live": "1"}, "▶ live"));
      }
      if (n.score !== undefined && n.score !== null) {
        g.append(svgEl("text", {x: NODE_W - 6, y: 15, class: "score " + (n.score > 0 ? "pos" : n.score < 0 ? "neg" : "zero"),
          "text-anchor": "end", "data-score": n.score}, "★" + fmtScore(n.score)));
      }
      const pick = Tree.picks.indexOf(n.image);
      if (pick >= 0) {
        g.classList.add("pick");
        g.append(svgEl("text", {x: -6, y: 15, class: "picklabel", "text-anchor": "end"}, "AB"[pick]));
      }
      d.far = (status(n) === "fail" ? "✗ " : "") + (n.names[0]
        || (n.score !== undefined && n.score !== null ? "★" + fmtScore(n.score) + " " : "") + (n.command || n.short));
      if (d.n.more || d.n.cut) {
        const plus = svgEl("g", {class: "more", transform: `translate(${NODE_W + 10},${NODE_H / 2})`, "data-more": i});
        plus.append(svgEl("circle", {r: 9}), svgEl("text", {y: 4, "text-anchor": "middle"}, "+"));
        plus.append(svgEl("title", {}, "load what grew from this image"));
        g.append(plus);
      }
    }
    nodes.append(g);
  });
  for (const m of merges) {
    const to = Tree.byImage.get(m.edge.image);
    if (!to) continue;
    const x1 = m.from.x + NODE_W, y1 = m.from.y, x2 = to.x, y2 = to.y + 8, mx = (x1 + x2) / 2;
    const p = svgEl("path", {d: `M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2},${y2}`, class: "edge merge " + status(m.edge)});
    p.append(svgEl("title", {}, "merge: " + commandText(m.edge.command)));
    edges.append(p);
  }
  vp.replaceChildren(edges, labels, nodes);
  const maxDepth = order.reduce((a, d) => Math.max(a, d.depth), 0);
  Tree.extent = {w: maxDepth * COL + NODE_W + 40, h: rows * ROW};
  const drawn = order.filter((d) => d.n).length;
  Tree.drawn = drawn;
  Tree.farK = 0;                              // the far labels are placed again (applyView)
  document.getElementById("treeinfo").textContent = Tree.comparing ? compareHint()
    : (Tree.matched ? `${Tree.matched.size} matching, ` : "") +
      `${drawn} images drawn, ${order.length - drawn} chains collapsed, ${Tree.loaded} loaded`;
  drawMinimap(order);
  return performance.now() - t0;
}

function compareHint() {
  return Tree.picks.length ? `picked ${Tree.picks[0].slice(0, 12)} (A): now pick B` : "pick two images to diff: A, then B";
}

// The overview: one mark per drawn node (a path per status: cheap for thousands), the window as
// a rectangle (applyView moves it). Shown past MINIMAP_AT drawn images.
function drawMinimap(order) {
  const mm = document.getElementById("minimap");
  if (!mm) return;
  const e = Tree.extent;
  mm.toggleAttribute("hidden", Tree.drawn <= MINIMAP_AT);         // (an SVG element has no .hidden)
  if (Tree.drawn <= MINIMAP_AT) { mm.replaceChildren(); return; }
  mm.setAttribute("viewBox", `-20 ${-ROW} ${e.w + 40} ${e.h + ROW}`);
  const paths = {pass: "", fail: "", none: "", match: ""};
  for (const d of order) {
    const st = d.n && Tree.matched && Tree.matched.has(d.n) ? "match" : d.edge ? status(d.edge) : "none";
    paths[st] += `M${d.x},${d.y - NODE_H / 2}h${NODE_W}v${NODE_H}h${-NODE_W}z`;
  }
  mm.replaceChildren(...Object.entries(paths).filter(([, p]) => p).map(([st, p]) => svgEl("path", {d: p, class: "mm " + st})),
    svgEl("rect", {id: "mmview", class: "mmview"}));
}

function placeMinimapView() {
  const box = document.getElementById("mmview");
  if (!box) return;
  const v = Tree.view, r = document.getElementById("tree").getBoundingClientRect(), e = Tree.extent;
  // the window in the tree's coordinates, clipped to the minimap's (the whole tree's) bounds
  const x0 = Math.max(-v.tx / v.k, -20), y0 = Math.max(-v.ty / v.k, -ROW);
  const x1 = Math.min((r.width - v.tx) / v.k, e.w + 20), y1 = Math.min((r.height - v.ty) / v.k, e.h);
  box.setAttribute("x", x0);
  box.setAttribute("y", y0);
  box.setAttribute("width", Math.max(x1 - x0, 1));
  box.setAttribute("height", Math.max(y1 - y0, 1));
}

// Far labels: drawn at FAR_FONT px on the screen whatever the zoom, each cut to the room before
// the next column. Where rows are closer than a label's height, some give way: per column, the
// named, matching, selected and picked images' first, then the others top to bottom, each kept
// only if it clears those kept. Placed again when the zoom changes by a tenth.
function placeFarLabels() {
  const svg = document.getElementById("tree"), k = Tree.view.k, far = k < FAR;
  svg.classList.toggle("far", far);
  svg.style.setProperty("--k", k);
  if (!far || (Tree.farK && Math.abs(k / Tree.farK - 1) < 0.1)) return;
  Tree.farK = k;
  const gap = FAR_FONT * 1.4 / k, room = COL * k - 8;
  const maxDepth = Tree.shown.reduce((a, d) => Math.max(a, d.depth), 0);
  const cols = new Map();
  for (const g of document.querySelectorAll("#viewport .node")) {
    const d = Tree.shown[Number(g.dataset.i)];
    if (!d || !d.far) continue;
    let label = g.querySelector(".flabel");
    if (!label) {                                     // made the first time the drawing is far: not on every paint
      label = svgEl("text", {x: 0, y: NODE_H / 2, dy: "0.35em", class: "flabel", "data-full": d.far}, cut(d.far, 24));
      g.append(label);
    }
    const first = !!(d.n && (d.n.names.length || d.n === Tree.selected || Tree.picks.includes(d.n.image)
      || (Tree.matched && Tree.matched.has(d.n))));
    if (!cols.has(d.depth)) cols.set(d.depth, []);
    cols.get(d.depth).push({y: d.y, label, first, depth: d.depth});
  }
  for (const items of cols.values()) {
    items.sort((a, b) => (b.first - a.first) || (a.y - b.y));
    const kept = [];                                  // ys kept, sorted
    for (const it of items) {
      let lo = 0, hi = kept.length;
      while (lo < hi) { const mid = (lo + hi) >> 1; if (kept[mid] < it.y) lo = mid + 1; else hi = mid; }
      const clear = (lo === kept.length || kept[lo] - it.y >= gap) && (lo === 0 || it.y - kept[lo - 1] >= gap);
      it.label.classList.toggle("hidden", !clear);
      if (!clear) continue;
      kept.splice(lo, 0, it.y);
      const chars = it.depth === maxDepth ? 24 : Math.max(3, Math.floor(room / (FAR_FONT * 0.55)));
      it.label.textContent = cut(it.label.dataset.full, chars);
    }
  }
}

function applyView() {
  const v = Tree.view;
  document.getElementById("viewport").setAttribute("transform", `translate(${v.tx},${v.ty}) scale(${v.k})`);
  placeFarLabels();
  placeMinimapView();
}

// Pick an image for the two-image diff: the second pick opens the diff of A to B.
function pickImage(n) {
  if (Tree.picks.includes(n.image)) Tree.picks = Tree.picks.filter((x) => x !== n.image);
  else Tree.picks.push(n.image);
  if (Tree.picks.length === 2) {
    const [a, b] = Tree.picks;
    Tree.picks = [];
    setComparing(false);
    if (Tree.onCompare) Tree.onCompare(a, b);
    return;
  }
  render();
  applyView();
}

function setComparing(on) {
  Tree.comparing = on;
  if (!on) Tree.picks = [];
  const b = document.getElementById("compare");
  b.classList.toggle("on", on);
  b.setAttribute("aria-pressed", on ? "true" : "false");
  if (Tree.root) { render(); applyView(); }
}

function fitView(readable) {
  const svg = document.getElementById("tree"), r = svg.getBoundingClientRect();
  const e = Tree.extent || {w: 1, h: 1};
  let k = Math.min((r.width - 40) / e.w, (r.height - 40) / e.h, 1.4);
  if (readable) k = Math.max(k, 0.55);
  k = Math.max(k, 0.02);
  const rootY = Tree.shown.length ? Tree.shown[0].y : 0;
  Tree.view = {k, tx: 20, ty: readable && e.h * k > r.height ? r.height / 2 - rootY * k : (r.height - e.h * k) / 2 + ROW / 2 * k};
  applyView();
}

function zoomAt(factor, cx, cy) {
  const v = Tree.view, k = Math.min(Math.max(v.k * factor, 0.02), 4);
  v.tx = cx - (cx - v.tx) * (k / v.k);
  v.ty = cy - (cy - v.ty) * (k / v.k);
  v.k = k;
  applyView();
}

// Load the tree of a ref and draw it; resolves with {ms: time to first paint}.
async function loadTree(ref, page) {
  const t0 = performance.now();
  Tree.page = Math.min(Math.max(Number(page) || TREE_PAGE, 1), 100000);
  const data = await api(`/images/${enc(ref)}/lineage${qs({max_nodes: Tree.page})}`);
  const t1 = performance.now();
  Tree.ref = ref;
  Tree.loaded = 0;
  Tree.expanded = new Set();
  Tree.selected = null;
  Tree.picks = [];
  Tree.root = adopt(data.tree, null);
  render();
  fitView(true);
  await new Promise((ok) => requestAnimationFrame(() => requestAnimationFrame(ok)));
  const ms = Math.round(performance.now() - t0);
  Object.assign(document.getElementById("tree").dataset, {paintMs: ms, fetchMs: Math.round(t1 - t0)});
  return {ms, image: data.image};
}

async function expandMore(n) {
  const t0 = performance.now();
  const data = await api(`/images/${enc(n.image)}/lineage${qs({max_nodes: Tree.page})}`);
  const sub = adopt(data.tree, n.parent);
  Tree.loaded -= 1;                                 // n itself was counted already
  n.kids = sub.kids;
  for (const k of n.kids) k.parent = n;
  n.more = n.cut = false;
  render();
  applyView();
  await new Promise((ok) => requestAnimationFrame(() => requestAnimationFrame(ok)));
  document.getElementById("tree").dataset.expandMs = Math.round(performance.now() - t0);
}

// Select the drawn node of an image (opening a chain that hides it); false if it is not loaded.
function selectImage(image) {
  let found = null;
  const stack = Tree.root ? [Tree.root] : [];
  while (stack.length && !found) {
    const n = stack.pop();
    if (n.image === image && !n.repeat) found = n;
    for (const k of n.kids) stack.push(k);
  }
  if (!found) return false;
  Tree.selected = found;
  render();
  keepInView();
  return true;
}

// After a selection or a resize: the selected node, if out of the window (or too small), centred.
function keepInView() {
  const d = Tree.selected && Tree.byImage.get(Tree.selected.image), v = Tree.view;
  const r = document.getElementById("tree").getBoundingClientRect();
  if (d) {
    const sx = d.x * v.k + v.tx, sy = d.y * v.k + v.ty;
    if (v.k < 0.5 || sx < 0 || sx + NODE_W * v.k > r.width || sy < 0 || sy > r.height) {
      v.k = Math.max(v.k, 0.8);
      v.tx = r.width / 2 - (d.x + NODE_W / 2) * v.k;
      v.ty = r.height / 2 - d.y * v.k;
    }
  }
  applyView();
}

function initTreeEvents() {
  const svg = document.getElementById("tree");
  let drag = null;
  // One tooltip for the whole drawing, filled on hover (a <title> per node and edge cost a
  // quarter of the first paint of a 1,000-node tree)
  const tip = document.getElementById("tip");
  svg.addEventListener("pointerover", (ev) => {
    const t = ev.target.closest("[data-i], [data-to]");
    const d = t && Tree.shown[Number(t.dataset.to !== undefined ? t.dataset.to : t.dataset.i)];
    if (!d) { tip.textContent = ""; return; }
    if (t.dataset.to !== undefined) tip.textContent = commandText(d.edge.command);
    else tip.textContent = d.n ? d.n.image + (d.n.names.length ? "\n" + d.n.names.join("\n") : "")
      + (d.n.score !== undefined && d.n.score !== null ? "\nscore " + fmtScore(d.n.score) : "")
      + (d.n.live ? "\nlive: fork_from starts its processes again" : "")
      + (Object.keys(d.n.metrics).length ? "\n" + metricsText(d.n) : "") : "";
  });
  svg.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    const r = svg.getBoundingClientRect();
    zoomAt(Math.exp(-ev.deltaY * 0.0015), ev.clientX - r.left, ev.clientY - r.top);
  }, {passive: false});
  svg.addEventListener("pointerdown", (ev) => {
    if (ev.target.closest(".node")) return;
    drag = {x: ev.clientX, y: ev.clientY, tx: Tree.view.tx, ty: Tree.view.ty};
    svg.setPointerCapture(ev.pointerId);
    svg.classList.add("dragging");
  });
  svg.addEventListener("pointermove", (ev) => {
    if (!drag) return;
    Tree.view.tx = drag.tx + ev.clientX - drag.x;
    Tree.view.ty = drag.ty + ev.clientY - drag.y;
    applyView();
  });
  const end = () => { drag = null; svg.classList.remove("dragging"); };
  svg.addEventListener("pointerup", end);
  svg.addEventListener("pointercancel", end);
  svg.addEventListener("click", (ev) => {
    const more = ev.target.closest("[data-more]");
    const d = Tree.shown[Number((more || ev.target.closest(".node") || {dataset: {}}).dataset[more ? "more" : "i"])];
    if (!d) return;
    if (more) { expandMore(d.n).catch(showError); return; }
    if (d.chain) { Tree.expanded.add(d.chain[0].image); render(); applyView(); return; }
    if (Tree.comparing || ev.shiftKey) { pickImage(d.n); return; }
    if (Tree.onSelect) Tree.onSelect(d.n);
  });
  document.getElementById("treebar").addEventListener("click", (ev) => {
    const z = ev.target.dataset && ev.target.dataset.zoom;
    const r = svg.getBoundingClientRect();
    if (z === "in") zoomAt(1.25, r.width / 2, r.height / 2);
    else if (z === "out") zoomAt(0.8, r.width / 2, r.height / 2);
    else if (z === "fit") fitView(false);
  });
  document.getElementById("compare").addEventListener("click", () => setComparing(!Tree.comparing));
  const filters = document.getElementById("filters");
  const refilter = () => {
    Tree.filter = {status: filters.elements.status.value, tag: filters.elements.tag.value.trim(),
      text: filters.elements.text.value.trim()};
    // (replaceState: no hashchange, so no new route for what is already drawn)
    const q = new URLSearchParams(location.hash.slice(1));
    for (const k of FILTER_KEYS) { if (Tree.filter[k]) q.set(k, Tree.filter[k]); else q.delete(k); }
    history.replaceState(null, "", "#" + q.toString());
    if (Tree.root) { render(); applyView(); }
  };
  filters.addEventListener("input", refilter);
  filters.addEventListener("change", refilter);
  filters.addEventListener("submit", (ev) => { ev.preventDefault(); refilter(); });
  const mm = document.getElementById("minimap");
  let mmDrag = false;
  const centreOn = (ev) => {               // the window centred where the minimap was clicked
    const pt = mm.createSVGPoint();
    pt.x = ev.clientX; pt.y = ev.clientY;
    const at = pt.matrixTransform(mm.getScreenCTM().inverse()), r = svg.getBoundingClientRect(), v = Tree.view;
    v.tx = r.width / 2 - at.x * v.k;
    v.ty = r.height / 2 - at.y * v.k;
    applyView();
  };
  mm.addEventListener("pointerdown", (ev) => { mmDrag = true; mm.setPointerCapture(ev.pointerId); centreOn(ev); });
  mm.addEventListener("pointermove", (ev) => { if (mmDrag) centreOn(ev); });
  mm.addEventListener("pointerup", () => { mmDrag = false; });
  document.getElementById("expandall").addEventListener("click", () => {
    Tree.expandAll = !Tree.expandAll;
    document.getElementById("expandall").textContent = Tree.expandAll ? "collapse chains" : "expand chains";
    if (Tree.root) { render(); applyView(); }
  });
}
