"""Pictures of the engine's answers that more than one adapter shows: a lineage tree (the dict
Engine.lineage_tree returns) as indented text and as an SVG. Pure functions of plain data, so the
CLI, MCP, the SDK and the web page draw the same tree the same way."""

from __future__ import annotations

import html

__all__ = ["render_text", "render_svg"]


def render_text(t: dict) -> str:
    lines = []

    def label(n):
        names = f" ({', '.join(n['names'])})" if n["names"] else ""
        return f"{n['short']}{names}" + (" (shown above)" if n.get("repeat") else "")

    def walk(n, prefix: str, last: bool, top: bool):
        edge = ""
        if n["command"] is not None:
            code = "" if n["exit_code"] is None else f" [exit {n['exit_code']}]"
            edge = f"  <- {n['command']}{code}"
        lines.append(("" if top else prefix + ("└── " if last else "├── ")) + label(n) + edge)
        kids = n["children"]
        for i, c in enumerate(kids):
            walk(c, "" if top else prefix + ("    " if last else "│   "), i == len(kids) - 1, False)

    walk(t, "", True, True)
    return "\n".join(lines) + "\n"


def render_svg(t: dict) -> str:
    """A top-down picture: boxes (short id, names, command) joined by edges labelled by exit code."""
    W, H, GX, GY = 230, 58, 20, 46
    pos: dict[int, tuple[float, float]] = {}
    nodes: list[tuple[dict, int]] = []
    edges: list[tuple[int, int, dict]] = []
    next_x = [0]

    def place(n, depth) -> float:
        idx = len(nodes)
        nodes.append((n, depth))
        if not n["children"]:
            x = next_x[0]
            next_x[0] += 1
        else:
            xs = []
            for c in n["children"]:
                cidx = len(nodes)
                xs.append(place(c, depth + 1))
                edges.append((idx, cidx, c))
            x = (xs[0] + xs[-1]) / 2
        pos[idx] = (x, depth)
        return x

    place(t, 0)
    width = max(1, next_x[0]) * (W + GX) + GX
    height = (max(d for _, d in nodes) + 1) * (H + GY) + GY
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
           f'font-family="monospace" font-size="11">',
           '<rect width="100%" height="100%" fill="white"/>']
    cx = lambda i: GX + pos[i][0] * (W + GX) + W / 2
    cy = lambda i: GY / 2 + pos[i][1] * (H + GY)
    for a, b, child in edges:
        x1, y1, x2, y2 = cx(a), cy(a) + H, cx(b), cy(b)
        colour = "#2a7" if child["exit_code"] in (0, None) else "#c33"
        out.append(f'<line x1="{x1:.0f}" y1="{y1:.0f}" x2="{x2:.0f}" y2="{y2:.0f}" stroke="{colour}" stroke-width="1.5"/>')
        if child["exit_code"] is not None:
            out.append(f'<text x="{(x1 + x2) / 2 + 4:.0f}" y="{(y1 + y2) / 2:.0f}" fill="{colour}">exit {child["exit_code"]}</text>')
    for i, (n, _) in enumerate(nodes):
        x, y = cx(i) - W / 2, cy(i)
        out.append(f'<rect x="{x:.0f}" y="{y:.0f}" width="{W}" height="{H}" rx="6" fill="#f4f6fb" stroke="#557"/>')
        texts = [n["short"] + ("  " + ", ".join(n["names"]) if n["names"] else ""),
                 (n["command"] or "(root)")[:32], (n["command"] or "")[32:64]]
        for k, s in enumerate(texts):
            if s:
                weight = ' font-weight="bold"' if k == 0 else ""
                out.append(f'<text x="{x + 8:.0f}" y="{y + 17 + 15 * k:.0f}"{weight}>{html.escape(s)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
