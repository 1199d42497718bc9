"""Run by bench/harborbench.py on Harbor's Python (Harbor needs >= 3.12: scripts/install-harbor): N trials'
environment lifecycle as Harbor's trial pays it, SandtreeEnvironment.start (the task's Dockerfile built:
cached after the first; the live sandbox; Harbor's log directories made) and stop (the final state
committed and tagged, the trial's record written, the sandbox stopped), each timed alone; one command
between them, as a trial runs at least one. Prints {"start": [s...], "stop": [s...]}.

    harbortrial.py TASK_DIR HOME N
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

from harbor.models.task.task import Task
from harbor.models.trial.paths import TrialPaths

from sandtree.integrations.harbor import SandtreeEnvironment


async def trial(task: Task, home: str, work: Path, i: int) -> tuple[float, float]:
    paths = TrialPaths(work / f"trial-{i}")
    paths.mkdir()
    env = SandtreeEnvironment(environment_dir=task.paths.environment_dir, environment_name=task.name,
                              session_id=f"trial-{i}__env", trial_paths=paths, task_env_config=task.config.environment,
                              logger=logging.getLogger("bench"), home=home)
    t = time.perf_counter()
    await env.start(force_build=False)
    started = time.perf_counter() - t
    r = await env.exec("echo ok > /app/out.txt")
    assert r.return_code == 0, r
    t = time.perf_counter()
    await env.stop(delete=True)
    return started, time.perf_counter() - t


async def main(task_dir: str, home: str, n: int) -> None:
    task = Task(Path(task_dir))
    with tempfile.TemporaryDirectory(prefix="harbor-bench-") as work:
        await trial(task, home, Path(work), -1)            # the build, once: cached from then on
        starts, stops = [], []
        for i in range(n):
            a, b = await trial(task, home, Path(work), i)
            starts.append(a)
            stops.append(b)
    print(json.dumps({"start": starts, "stop": stops}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
