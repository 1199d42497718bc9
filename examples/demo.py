"""`make demo`: build a Debian base image, then branch, fork, roll back, show the lineage, and a
live sandbox hibernated and resumed.

Uses only the public Python API. The store is $SANDTREE_HOME (default ~/.local/share/sandtree);
the base image is built once (debootstrap, about a minute) and reused by later runs.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.table import Table

import sandtree

con = Console()
st = sandtree.Sandtree()
con.print(f"[bold]sandtree demo[/] - store at {st.home}")

# 1. A base image: Debian bookworm with python3, built once and tagged.
try:
    base = st.image("debian:bookworm-python")
    con.print(f"base image [cyan]{base.short_id}[/] (debian:bookworm-python, already built)")
except sandtree.ImageNotFound:
    with con.status("bootstrapping debian:bookworm + python3 (about a minute, once)") as status:
        base = st.bootstrap("debian:bookworm", include=["python3"], tag="debian:bookworm-python",
                            log=lambda line: status.update(f"debootstrap: {line[:90]}"))
    con.print(f"built base image [cyan]{base.short_id}[/]")

r = base.run("python3 -V")
con.print(f"$ python3 -V -> {r.stdout.decode().strip()}   (same image back: {r.image == base})")

# 2. A checkpoint: install a tiny "project" into the image; the run's result is a new image.
setup = base.run("mkdir -p /app && cd /app && printf 'def add(a, b):\\n    return a - b\\n' > calc.py "
                 "&& printf 'from calc import add\\nassert add(2, 3) == 5, add(2, 3)\\nprint(\"ok\")\\n' > test.py")
checkpoint = setup.image.tag("demo/checkpoint")
con.print(f"checkpoint [cyan]{checkpoint.short_id}[/]: /app/calc.py has a bug")

# 3. Fork: three candidate fixes from the same checkpoint, in parallel; keep the one whose test passes.
fixes = {"swap": "sed -i 's/a - b/b - a/' calc.py", "plus": "sed -i 's/a - b/a + b/' calc.py",
         "times": "sed -i 's/a - b/a * b/' calc.py"}
t0 = time.perf_counter()
results = checkpoint.fork([f"cd /app && {c} && python3 test.py" for c in fixes.values()], parallel=3)
table = Table("branch", "image", "exit", "output", title=f"fork: 3 branches in {time.perf_counter() - t0:.2f} s")
for name, res in zip(fixes, results, strict=False):
    out = (res.stdout or res.stderr).decode().strip().splitlines()
    table.add_row(name, res.image.short_id, str(res.exit_code), out[-1] if out else "")
con.print(table)
best = sandtree.best_of(results, score=lambda r: r.exit_code == 0)      # the losers' images go
winner = best.image.tag("demo/fixed")
con.print(f"winner [green]{winner.short_id}[/] tagged demo/fixed. Its diff from the checkpoint:")
con.print(checkpoint.patch(winner).replace("[", "\\["), end="")

# 4. Merge: meanwhile another line of work added docs; a three-way merge combines both.
docs = st.branch("demo/docs", from_=checkpoint, force=True)
docs.run("printf '# calc\\nadd(a, b) returns a + b\\n' > /app/README.md")
merged = st.merge(None, winner, docs.head)                  # base: their common ancestor
con.print(f"merge of demo/fixed and demo/docs -> [cyan]{merged.image.short_id}[/] "
          f"(conflicts: {len(merged.conflicts)}), files: {[e['name'] for e in merged.image.ls('/app')]}")

# 5. Rollback: a branch advances with each run; a destructive run is undone by moving it back.
main = st.branch("demo/main", from_=merged.image, force=True)
broken = main.run("rm -rf /usr/lib/python3* && python3 -c 'print(1)'")
con.print(f"after `rm -rf /usr/lib/python3*` on demo/main: exit {broken.exit_code}, head {main.head.short_id}")
main.rollback(steps=1)
again = main.run("cd /app && python3 test.py")
con.print(f"rolled demo/main back to [cyan]{merged.image.short_id}[/]; test says {again.stdout.decode().strip()!r}")

# 6. Lineage: the tree of everything made from the checkpoint, as text and as a picture.
con.print("\n[bold]lineage under demo/checkpoint[/] (sandtree tree demo/checkpoint):")
con.print(checkpoint.lineage("text").replace("[", "\\["), end="")
svg = "/tmp/sandtree-demo-lineage.svg"
with open(svg, "w") as f:
    f.write(checkpoint.lineage("svg"))
con.print(f"\npicture: {svg}")

# 7. A live sandbox: a Python process keeps state in memory across commands; hibernate saves it
#    (files as an image, processes with their memory) and frees the machine; resume continues it.
con.print("\n[bold]live sandbox[/] on demo/main:")
with main.head.start(idle_timeout=120) as sb:
    sb.exec("cd /app && export GREETING=hello")
    sb.exec("python3 -c 'import time, os\nn = 0\nwhile True:\n n += 1\n open(\"/tmp/n\", \"w\").write(str(n))"
            "\n time.sleep(0.01)' > /dev/null 2>&1 &")
    time.sleep(0.3)
    con.print(f"  session: {sb.exec('pwd; echo $GREETING').stdout.decode().split()}, "
              f"counter at {sb.read('/tmp/n').decode()}")
    try:
        t0 = time.perf_counter()
        info = sb.hibernate()
        t1 = time.perf_counter()
        sb.resume()
        t2 = time.perf_counter()
        time.sleep(0.2)
        con.print(f"  hibernated in {(t1 - t0) * 1e3:.0f} ms (files: image {info['head'][:12]}), resumed in "
                  f"{(t2 - t1) * 1e3:.0f} ms: counter at {sb.read('/tmp/n').decode()}, counting on")
    except sandtree.RuntimeUnavailable as exc:
        con.print(f"  (hibernate unavailable here: {exc})")
    snap = sb.commit(tag="demo/live")
    con.print(f"  committed while running: [cyan]{snap.short_id}[/] (demo/live)")

con.print("Try: sandtree image list; sandtree log demo/fixed; sandtree diff demo/checkpoint demo/fixed --patch;"
          " sandtree run demo/main -- python3 /app/test.py; sandtree start demo/main; sandtree ps")
