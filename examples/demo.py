"""`make demo`: build a Debian base image, then branch, fork, roll back and show the lineage.

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
setup = base.run("mkdir -p /work && cd /work && printf 'def add(a, b):\\n    return a - b\\n' > calc.py "
                 "&& printf 'from calc import add\\nassert add(2, 3) == 5, add(2, 3)\\nprint(\"ok\")\\n' > test.py")
checkpoint = setup.image.tag("demo/checkpoint")
con.print(f"checkpoint [cyan]{checkpoint.short_id}[/]: /work/calc.py has a bug")

# 3. Fork: three candidate fixes from the same checkpoint, in parallel; keep the one whose test passes.
fixes = {"swap": "sed -i 's/a - b/b - a/' calc.py", "plus": "sed -i 's/a - b/a + b/' calc.py",
         "times": "sed -i 's/a - b/a * b/' calc.py"}
t0 = time.perf_counter()
from concurrent.futures import ThreadPoolExecutor
with ThreadPoolExecutor(3) as pool:
    results = dict(zip(fixes, pool.map(lambda c: checkpoint.run(f"cd /work && {c} && python3 test.py"),
                                       fixes.values())))
table = Table("branch", "image", "exit", "output", title=f"fork: 3 branches in {time.perf_counter() - t0:.2f} s")
for name, res in results.items():
    out = (res.stdout or res.stderr).decode().strip().splitlines()
    table.add_row(name, res.image.short_id, str(res.exit_code), out[-1] if out else "")
con.print(table)
winner = next(res.image for res in results.values() if res.ok)
winner.tag("demo/fixed")
con.print(f"winner [green]{winner.short_id}[/] tagged demo/fixed; the diff is in {winner.read('/work/calc.py')!r}")

# 4. Rollback: a destructive command breaks the environment; step back to its parent and go on.
broken = winner.run("rm -rf /usr/lib/python3* && python3 -c 'print(1)'")
con.print(f"after `rm -rf /usr/lib/python3*`: exit {broken.exit_code} ({broken.image.short_id} is broken)")
rolled_back = broken.image.parents()[0]
again = rolled_back.run("cd /work && python3 test.py")
con.print(f"rolled back to [cyan]{rolled_back.short_id}[/] (= winner: {rolled_back == winner}); "
          f"test says {again.stdout.decode().strip()!r}")

# 5. Lineage: how the winner came to be, command by command.
con.print("\n[bold]lineage of demo/fixed[/] (sandtree log demo/fixed):")
for entry in winner.log():
    tags = f" ({', '.join(entry['tags'])})" if entry["tags"] else ""
    con.print(f"  {entry['image'][:12]}{tags}  {entry['command'] or ''}")
con.print("\nTry: sandtree image list; sandtree log demo/fixed; sandtree run demo/fixed -- python3 /work/test.py")
