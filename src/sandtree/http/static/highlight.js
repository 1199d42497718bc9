// sandtree's web page: a small syntax highlighter for the file viewer. Per line: comments,
// strings, numbers and a language's keywords become spans (classes hl-c, hl-s, hl-n, hl-k); the
// language is guessed from the file name. Text only (textContent): nothing in a file is markup.
"use strict";

const HL_LANGS = {
  py: {line: "#", kw: "False None True and as assert async await break class continue def del elif else except finally for from global if import in is lambda nonlocal not or pass raise return try while with yield self"},
  sh: {line: "#", kw: "if then else elif fi for while until do done case esac in function return local export set unset echo exit break continue source"},
  c: {line: "//", block: true, kw: "auto break case char const continue default do double else enum extern float for goto if int long register return short signed sizeof static struct switch typedef union unsigned void volatile while include define bool true false NULL"},
  js: {line: "//", block: true, kw: "async await break case catch class const continue default delete do else export extends false finally for function if import in instanceof let new null return static super switch this throw true try typeof undefined var void while yield"},
  go: {line: "//", block: true, kw: "break case chan const continue default defer else fallthrough for func go goto if import interface map package range return select struct switch type var nil true false"},
  rs: {line: "//", block: true, kw: "as async await break const continue crate else enum extern false fn for if impl in let loop match mod move mut pub ref return self Self static struct super trait true type unsafe use where while"},
  conf: {line: "#", kw: "true false yes no on off null"},
};
const HL_EXT = {py: "py", sh: "sh", bash: "sh", c: "c", h: "c", cc: "c", cpp: "c", hpp: "c", java: "c", js: "js", mjs: "js",
  ts: "js", json: "js", go: "go", rs: "rs", yaml: "conf", yml: "conf", toml: "conf", ini: "conf", cfg: "conf", conf: "conf"};
const HL_MAX = 200 * 1024;        // larger files are shown plain

function hlLanguage(path, text) {
  const name = path.split("/").pop();
  const ext = name.includes(".") ? name.split(".").pop().toLowerCase() : "";
  if (HL_EXT[ext]) return HL_LANGS[HL_EXT[ext]];
  if (name === "Dockerfile" || name === "Makefile") return HL_LANGS.sh;
  const first = text.slice(0, 80);
  if (/^#!.*python/.test(first)) return HL_LANGS.py;
  if (/^#!.*(sh|bash)\b/.test(first)) return HL_LANGS.sh;
  return null;
}

// A DocumentFragment of the text with spans, or null (no language, or too big).
function highlight(path, text) {
  const lang = hlLanguage(path, text);
  if (!lang || text.length > HL_MAX) return null;
  const kw = new Set(lang.kw.split(" "));
  const esc = (s) => s.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&");
  const parts = [lang.block ? "/\\*[\\s\\S]*?\\*/" : null, esc(lang.line) + ".*", "\"(?:[^\"\\\\\\n]|\\\\.)*\"?",
    "'(?:[^'\\\\\\n]|\\\\.)*'?", "\\b\\d[\\d_.xXa-fA-F]*\\b", "[A-Za-z_][A-Za-z0-9_]*"].filter(Boolean);
  const re = new RegExp(parts.join("|"), "g");
  const frag = document.createDocumentFragment();
  let last = 0, m;
  const span = (cls, s) => { const n = document.createElement("span"); n.className = cls; n.textContent = s; frag.append(n); };
  while ((m = re.exec(text)) !== null) {
    const t = m[0];
    if (m.index > last) frag.append(text.slice(last, m.index));
    if (t.startsWith(lang.line) || t.startsWith("/*")) span("hl-c", t);
    else if (t[0] === "\"" || t[0] === "'") span("hl-s", t);
    else if (/^\d/.test(t)) span("hl-n", t);
    else if (kw.has(t)) span("hl-k", t);
    else frag.append(t);
    last = m.index + t.length;
  }
  if (last < text.length) frag.append(text.slice(last));
  return frag;
}
