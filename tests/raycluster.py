"""A real Ray cluster on this machine for the tests: a head (GCS only, no CPUs: it runs no sandtree
node) and worker nodes, each `ray start --block` in a session of its own, all on 127.0.0.1 with
free ports, in a short temp dir of their own (Ray's socket paths must stay under 108 bytes).

Stopping kills each node's process group (never `ray stop`, which kills every Ray process on the
machine, other sessions' included). kill(i) is the failure test's `kill -9` of worker node i: its
raylet, agents and workers (the node actor and its engine) at once. The head's health check is
tightened so Ray notices a lost node in about a second instead of the default ~30 s."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import sandtree

PREFIX = f"st-ray-{os.getpid()}-"      # the leak check (conftest.py) finds our processes by it
RAY = os.path.join(os.path.dirname(sys.executable), "ray")


class Unavailable(Exception):
    pass


def _free_port() -> int:
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class RayCluster:
    def __init__(self):
        self.dir = None
        self.head = None
        self.workers: list[subprocess.Popen | None] = []
        self.port = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def client_address(self) -> str:
        """Ray Client's (the head's proxy): ray://127.0.0.1:PORT."""
        return f"ray://127.0.0.1:{self.client_port}"

    def _env(self) -> dict:
        src = os.path.dirname(os.path.dirname(os.path.abspath(sandtree.__file__)))
        env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""),
               "RAY_USAGE_STATS_ENABLED": "0", "RAY_health_check_period_ms": "500",
               "RAY_health_check_failure_threshold": "3", "RAY_health_check_initial_delay_ms": "1000",
               "RAY_health_check_timeout_ms": "1000"}
        env.pop("RAY_ADDRESS", None)
        return env

    def _start(self, *args: str, env: dict | None = None) -> subprocess.Popen:
        with open(os.path.join(self.dir, f"start-{len(self.workers) + (self.head is not None)}.log"), "wb") as log:
            return self._popen(log, *args, env=env)

    def _popen(self, log, *args: str, env: dict | None = None) -> subprocess.Popen:
        return subprocess.Popen([RAY, "start", "--block", "--node-ip-address=127.0.0.1", "--disable-usage-stats",
                                 f"--dashboard-agent-listen-port={_free_port()}", *args],
                                env=env or self._env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def start(self, workers: int = 2, cpus: int = 1, timeout: float = 60.0) -> "RayCluster":
        """Unavailable (with the reason) when it cannot; whatever failed, nothing stays running."""
        try:
            return self._start_all(workers, cpus, timeout)
        except BaseException:
            self.stop()
            raise

    def _start_all(self, workers: int, cpus: int, timeout: float) -> "RayCluster":
        if not os.path.exists(RAY):
            raise Unavailable("Ray is not installed (pip install 'sandtree[cluster]')")
        self.dir = tempfile.mkdtemp(prefix=PREFIX, dir="/tmp")
        self.port, self.client_port = _free_port(), _free_port()
        # One at a time: nodes joining while the head still starts (or two at once, on 2 busy
        # CPUs) were seen to hang for a minute.
        # GRPC_ENABLE_FORK_SUPPORT=0: the head's Ray Client proxy forks a server process per client
        # while its gRPC threads run; with gRPC's fork handlers on, about one connection in eight
        # (eight at once, on 2 busy CPUs) died in that child before exec ("Starting Ray client
        # server failed"); with them off, none of 24 (docs/design.md)
        self.head = self._start("--head", f"--port={self.port}", "--num-cpus=0", f"--temp-dir={self.dir}",
                                "--include-dashboard=false", f"--ray-client-server-port={self.client_port}",
                                f"--dashboard-port={_free_port()}", env={**self._env(), "GRPC_ENABLE_FORK_SUPPORT": "0"})
        self._wait_started(0, self.head, timeout)
        for _ in range(workers):
            self.add_worker(cpus, timeout)
        return self

    def add_worker(self, cpus: int = 1, timeout: float = 60.0) -> None:
        proc = self._start(f"--address={self.address}", f"--num-cpus={cpus}")
        self.workers.append(proc)
        self._wait_started(len(self.workers), proc, timeout)

    def _wait_started(self, i: int, proc: subprocess.Popen, timeout: float) -> None:
        """Until `ray start` of node i says the runtime started (it then blocks)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if proc.poll() is not None:
                raise Unavailable(f"`ray start` of node {i} exited: {self._log(i)[-800:]}")
            if "Ray runtime started" in self._log(i):
                return
            time.sleep(0.1)
        raise Unavailable(f"Ray node {i} did not start in {timeout:.0f} s: {self._log(i)[-800:]}")

    def nodes(self) -> list[dict]:
        """The live nodes with CPUs, asked of the GCS by a separate process (the test's own Ray
        connection belongs to the engine)."""
        code = ("import json, ray; ray.init(address=%r, logging_level='ERROR', log_to_driver=False); "
                "print('NODES=' + json.dumps([n for n in ray.nodes() if n['Alive']]))" % self.address)
        out = subprocess.run([sys.executable, "-c", code], env=self._env(), capture_output=True, text=True,
                             timeout=60)
        if out.returncode != 0:
            return []
        line = next((l for l in out.stdout.splitlines() if l.startswith("NODES=")), "NODES=[]")
        return [n for n in json.loads(line[6:]) if n["Resources"].get("CPU", 0) > 0]

    def _log(self, i: int) -> str:
        try:
            with open(os.path.join(self.dir, f"start-{i}.log"), "rb") as f:
                return f.read()[-2000:].decode("utf-8", "replace")
        except OSError:
            return ""

    def node_id(self, i: int) -> str | None:
        """The Ray node ID of worker node i (its raylet's --node_id)."""
        for pid in _tree(self.workers[i].pid):
            args = _cmdline(pid)
            if "raylet/raylet" in args:
                return next((a.split("=", 1)[1] for a in args.split() if a.startswith("--node_id=")), None)
        return None

    def kill(self, i: int) -> None:
        """kill -9 every process of worker node i: `ray start`, the raylet, its agents and its
        workers (which leave the process group: found as descendants), all at once."""
        proc = self.workers[i]
        if proc is None:
            return
        for pid in _tree(proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
        self.workers[i] = None

    def stop(self) -> None:
        for i in range(len(self.workers)):
            self.kill(i)
        if self.head is not None:
            for pid in _tree(self.head.pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.head.wait()
            self.head = None
        # a Ray process that left its group (none should) is still ours if it names our dir
        for pid in _ours(self.dir):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)   # (Ray mounts nothing; its sockets and logs only)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def _tree(root: int) -> list[int]:
    """root, the members of its process group and all their descendants."""
    parent, group = {}, []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parent[int(name)] = int(fields[1])
            if int(fields[2]) == root:
                group.append(int(name))
    found, todo = set(), [root, *group]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += [c for c, p in parent.items() if p == pid]
    return sorted(found)


def _ours(path: str | None) -> list[int]:
    if not path:
        return []
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if path.encode() in f.read():
                        out.append(int(pid))
            except OSError:
                pass
    return out
