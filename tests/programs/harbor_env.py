"""Drives one SandtreeEnvironment the way Harbor's trial does, for tests/integrations/test_harbor.py: Harbor
needs Python >= 3.12, so this runs on Harbor's Python (scripts/install-harbor) while the tests run on the
project's. It reports what it saw; the test asserts.

    harbor_env.py SPEC.json   -> one JSON object on stdout

SPEC: {"task": a task dir (its task.toml and environment/), "trial_dir", "kwargs": the environment's
kwargs (home or url, ...), "network": {"network_mode", "allowed_hosts"} (the start policy),
"phases": [policies] (Harbor's phase_network_policies), "init": more constructor arguments
(override_cpus, cpu_enforcement_policy, ...), "steps": [{"op": ..., ...}]}. Ops: exec (command, user,
cwd, env, timeout), exec_stream (command: the output callback's chunks), set_network (network_mode, allowed_hosts), upload_file / upload_dir (source,
target), download_file / download_dir (source, target), info (the sandbox's info), stop (delete).
Each step's result is {"ok": ...} or {"error": "Type: message"}; the constructor's and start's too."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import traceback
from pathlib import Path


def _error(e: BaseException) -> dict:
    return {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}


async def main(spec: dict) -> dict:
    from harbor.models.task.config import NetworkPolicy
    from harbor.models.task.task import Task
    from harbor.models.trial.paths import TrialPaths

    from sandtree.integrations.harbor import SandtreeEnvironment

    task = Task(Path(spec["task"]))
    trial = Path(spec["trial_dir"])
    paths = TrialPaths(trial)
    paths.mkdir()
    out: dict = {"steps": []}
    try:
        env = SandtreeEnvironment(
            environment_dir=task.paths.environment_dir, environment_name=task.name,
            session_id=f"{trial.name}__env", trial_paths=paths, task_env_config=task.config.environment,
            network_policy=NetworkPolicy(**spec["network"]) if spec.get("network") else None,
            phase_network_policies=[NetworkPolicy(**p) for p in spec.get("phases", [])] or None,
            logger=logging.getLogger("harbor_env"), **spec.get("init", {}), **spec.get("kwargs", {}))
    except Exception as e:
        out["init"] = _error(e)
        return out
    out["capabilities"] = env.capabilities.model_dump()
    out["resource_capabilities"] = type(env).resource_capabilities().model_dump()
    try:
        await env.start(force_build=False)
        out["start"] = {"ok": True, "source": env.source}
    except Exception as e:
        out["start"] = _error(e)
        return out
    stopped = False
    try:
        for step in spec.get("steps", []):
            op = step["op"]
            try:
                if op == "exec":
                    r = await env.exec(step["command"], cwd=step.get("cwd"), env=step.get("env"),
                                       timeout_sec=step.get("timeout"), user=step.get("user"))
                    res = {"ok": True, "stdout": r.stdout, "stderr": r.stderr, "code": r.return_code}
                elif op == "exec_stream":         # with Harbor's output callback scoped, as its trial does
                    chunks = []

                    async def collect(text, stream):
                        chunks.append([stream, text])
                    with env.scoped_output_callback(collect):
                        r = await env.exec(step["command"])
                    res = {"ok": True, "stdout": r.stdout, "code": r.return_code, "chunks": chunks}
                elif op == "set_network":
                    await env.set_network_policy(NetworkPolicy(network_mode=step["network_mode"],
                                                               allowed_hosts=step.get("allowed_hosts", [])))
                    res = {"ok": True}
                elif op in ("upload_file", "upload_dir", "download_file", "download_dir"):
                    await getattr(env, op)(step["source"], step["target"])
                    res = {"ok": True}
                elif op == "info":
                    res = {"ok": True, "info": env.sandbox.info()}
                elif op == "stop":
                    await env.stop(delete=step.get("delete", True))
                    stopped = True
                    res = {"ok": True, "image": env.image,
                           "record": json.loads((trial / "sandtree.json").read_text())}
                else:
                    res = {"error": f"unknown op {op}"}
            except Exception as e:
                res = _error(e)
            out["steps"].append(res)
    finally:
        if not stopped:
            await env.stop(delete=True)
    return out


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    print(json.dumps(asyncio.run(main(spec)), default=str))
