"""Harbor tasks for the Harbor tests (tests/integrations/test_harbor.py) and bench/harborbench.py, in Harbor's
own task format (task.toml, instruction.md, environment/Dockerfile, solution/solve.sh, tests/test.sh),
and the Python that runs Harbor (scripts/install-harbor: Harbor needs Python >= 3.12).

    hello-world      the oracle writes /app/hello.txt; the verifier checks it: reward 1
    wrong-answer     the same task, a wrong reference solution: reward 0 (rewards are not constant)
    offline-verifier the agent phase has no network (its probe of the allowed host must fail); the verifier
                     phase is allowed one address (a test-made server): reward 1 when both held
    <swe instance>   a data/evalset instance in the shape of Harbor's SWE-bench adapter: its environment
                     image (FROM the prebuilt eval environment), the gold patch as the solution, the test
                     patch + test command + FAIL_TO_PASS/PASS_TO_PASS grading as the verifier
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INSTALL = os.path.join(REPO, "scripts", "install-harbor")
HARBOR_VERSION = "0.26.0"


def harbor_python() -> tuple[str | None, str]:
    """(the venv python that runs Harbor, "") or (None, why not): made by scripts/install-harbor (cached;
    `make test` runs it first)."""
    if os.geteuid() != 0:
        return None, "Harbor's Python is installed as root (scripts/install-harbor)"
    p = subprocess.run([INSTALL, "--print-python"], capture_output=True, text=True, timeout=1800)
    if p.returncode != 0 or not p.stdout.strip():
        return None, f"scripts/install-harbor failed: {p.stderr[-500:]}"
    return p.stdout.strip().splitlines()[-1], ""


def _write(path: str, text: str, mode: int = 0o644) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)


def _task(root: str, name: str, *, toml: str, dockerfile: str, solve: str, test: str,
          files: dict[str, str] | None = None) -> str:
    d = os.path.join(root, name)
    _write(os.path.join(d, "task.toml"), 'schema_version = "1.4"\n\n[metadata]\n' + textwrap.dedent(toml))
    _write(os.path.join(d, "instruction.md"), f"Solve the task {name}.\n")
    _write(os.path.join(d, "environment", "Dockerfile"), textwrap.dedent(dockerfile))
    _write(os.path.join(d, "solution", "solve.sh"), "#!/bin/sh\nset -e\n" + textwrap.dedent(solve), 0o755)
    _write(os.path.join(d, "tests", "test.sh"), "#!/bin/sh\n" + textwrap.dedent(test), 0o755)
    for rel, text in (files or {}).items():
        _write(os.path.join(d, rel), text)
    return d


LIMITS = """
[agent]
timeout_sec = 300.0

[verifier]
timeout_sec = 300.0

[environment]
build_timeout_sec = 600.0
cpus = 1
memory_mb = 1024
storage_mb = 2048
"""

HELLO_CHECK = """
if [ "$(cat /app/hello.txt 2>/dev/null)" = "Hello, world!" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


def hello_tasks(root: str, base: str) -> list[str]:
    dockerfile = f"FROM {base}\nRUN mkdir -p /app\nWORKDIR /app\n"
    return [_task(root, "hello-world", toml=LIMITS, dockerfile=dockerfile,
                  solve='echo "Hello, world!" > /app/hello.txt\n', test=HELLO_CHECK),
            _task(root, "wrong-answer", toml=LIMITS, dockerfile=dockerfile,
                  solve='echo "Goodbye, world!" > /app/hello.txt\n', test=HELLO_CHECK)]


PROBE = """python3 - "$1" <<'PY'
import sys, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())
except Exception as e:
    print("ERROR", type(e).__name__, e)
PY
"""


def offline_task(root: str, base: str, host: str) -> str:
    """The agent phase offline, the verifier allowed `host` (an address of a test-made server on port 80)."""
    toml = f"""
[agent]
timeout_sec = 300.0
network_mode = "no-network"

[verifier]
timeout_sec = 300.0
network_mode = "allowlist"
allowed_hosts = ["{host}"]

[environment]
build_timeout_sec = 600.0
"""
    solve = f"""cat > /usr/local/bin/probe <<'SH'
#!/bin/sh
{PROBE}SH
chmod 755 /usr/local/bin/probe
probe http://{host}/harbor-agent > /app/agent-probe.txt
if grep -q harbor-agent /app/agent-probe.txt; then echo online; else echo offline; fi > /app/agent-network
"""
    test = f"""net=$(cat /app/agent-network 2>/dev/null)
body=$(probe http://{host}/harbor-verifier)
echo "agent phase: $net"; echo "verifier phase: $body"
if [ "$net" = offline ] && echo "$body" | grep -q harbor-verifier; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""
    return _task(root, "offline-verifier", toml=toml, dockerfile=f"FROM {base}\nRUN mkdir -p /app\nWORKDIR /app\n",
                 solve=solve, test=test)


GRADE = '''"""FAIL_TO_PASS and PASS_TO_PASS from pytest's -rA summary (as swebench's parse_log_pytest reads it)."""
import json, sys
inst = json.load(open(sys.argv[1]))
status = {}
for line in open(sys.argv[2], errors="replace"):
    for word in ("PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL"):
        if line.startswith(word + " "):
            status[line[len(word) + 1:].split(" - ")[0].strip()] = word
f2p = [t for t in inst["FAIL_TO_PASS"] if status.get(t) == "PASSED"]
p2p = [t for t in inst["PASS_TO_PASS"] if status.get(t) == "PASSED"]
resolved = len(f2p) == len(inst["FAIL_TO_PASS"]) and len(p2p) == len(inst["PASS_TO_PASS"])
print(json.dumps({"reward": 1.0 if resolved else 0.0, "fail_to_pass_passed": len(f2p),
                  "fail_to_pass_failed": len(inst["FAIL_TO_PASS"]) - len(f2p), "pass_to_pass_passed": len(p2p),
                  "pass_to_pass_failed": len(inst["PASS_TO_PASS"]) - len(p2p)}))
'''


def swe_task(root: str, inst: dict, environment: str, *, patch: str | None = None) -> str:
    """A data/evalset instance as Harbor's SWE-bench adapter lays one out: `environment` is the prebuilt
    environment image (a store ref); the solution applies `patch` (default: the gold patch)."""
    meta = {k: inst[k] for k in ("instance_id", "FAIL_TO_PASS", "PASS_TO_PASS", "test_cmd")}
    test = f"""cd /testbed
git apply -v /tests/test.patch
{inst["test_cmd"]} > /logs/verifier/test-output.txt 2>&1 || true
python3 /tests/grade.py /tests/instance.json /logs/verifier/test-output.txt > /logs/verifier/reward.json
cat /logs/verifier/reward.json
"""
    return _task(root, inst["instance_id"].lower(), toml=LIMITS, dockerfile=f"FROM {environment}\nWORKDIR /testbed\n",
                 solve="cd /testbed\ngit apply -v /solution/fix.patch\n", test=test,
                 files={"solution/fix.patch": inst["patch"] if patch is None else patch,
                        "tests/test.patch": inst["test_patch"], "tests/grade.py": GRADE,
                        "tests/instance.json": json.dumps(meta)})


def job_config(path: str, name: str, jobs_dir: str, tasks: list[str], kwargs: dict, *, concurrent: int = 2) -> str:
    """A Harbor JobConfig (JSON is YAML) running Harbor's oracle agent on `tasks` through SandtreeEnvironment."""
    config = {"job_name": name, "jobs_dir": jobs_dir, "n_attempts": 1, "n_concurrent_trials": concurrent,
              "quiet": True, "agents": [{"name": "oracle"}],
              "environment": {"import_path": "sandtree.integrations.harbor:SandtreeEnvironment", "kwargs": kwargs},
              "tasks": [{"path": t} for t in tasks]}
    with open(path, "w") as f:
        json.dump(config, f, indent=2)
    return path


def trials(job_dir: str) -> dict[str, dict]:
    """Each trial of a finished job by task name: {"result": result.json, "sandtree": its sandtree.json}."""
    out = {}
    for name in sorted(os.listdir(job_dir)):
        d = os.path.join(job_dir, name)
        if not os.path.isfile(os.path.join(d, "result.json")):
            continue
        with open(os.path.join(d, "result.json")) as f:
            result = json.load(f)
        record = {}
        if os.path.exists(os.path.join(d, "sandtree.json")):
            with open(os.path.join(d, "sandtree.json")) as f:
                record = json.load(f)
        out[result["task_name"]] = {"result": result, "sandtree": record, "dir": d}
    return out
