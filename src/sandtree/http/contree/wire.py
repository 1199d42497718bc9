"""Contree's wire shapes from sandtree's records, and back (for contree/wire.py).

Names: Contree names images, operations and uploads by UUID. Ours are hex digests (images,
uploads: sha256) and uuid4 hex (operations), so a UUID is just the first 128 bits of the ID,
and goes back by prefix: stable across restarts, with no mapping table.
"""

import base64
import datetime as dt
import json
import os
import re
import stat as stat_mod
import time
import uuid as uuid_mod

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ...errors import InvalidInput, NotFound
from ..models import utf8_only

# our operation statuses -> Contree's enum (a run that exited non-zero still SUCCEEDED: it ran)
OP_STATUS = {"queued": "PENDING", "running": "EXECUTING", "done": "SUCCESS", "failed": "FAILED",
             "cancelled": "CANCELLED"}
TERMINAL = {"SUCCESS", "FAILED", "CANCELLED"}

# our scopes -> Contree's permission names
PERMISSIONS = {"import": ["import"], "run": ["spawn", "spawn_disposable"], "list": ["list"],
               "cancel": ["cancel"], "tag": ["set_image_tag"]}


# ---- names ----------------------------------------------------------------------------------------
def to_uuid(hex_id: str | None) -> str | None:
    """The UUID of an ID: its first 128 bits."""
    return str(uuid_mod.UUID(hex_id[:32])) if hex_id else None


def from_uuid(value: str, what: str) -> str:
    try:
        return uuid_mod.UUID(value).hex
    except (ValueError, AttributeError, TypeError):
        raise InvalidInput(f"{what} must be a UUID, not {value!r}") from None


def image_of(engine, ref: str) -> str:
    """An image ID for a UUID or `tag:NAME` (Contree's ImageSource)."""
    if not isinstance(ref, str) or not ref:
        raise InvalidInput("image must be a UUID or tag:NAME")
    if ref.startswith("tag:"):
        return tagged(engine, ref[4:])
    return engine.resolve(from_uuid(ref, "image"))


def tagged(engine, tag: str) -> str:
    """The image a tag names: only tags (not IDs, prefixes or branches)."""
    image = engine.tags().get(tag)
    if image is None:
        raise NotFound(f"no image tagged {tag!r}")
    return image


def iso(ts: float | None) -> str | None:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat() if ts is not None else None


def image_view(info: dict, tag: str | None = None) -> dict:
    tags = info.get("tags") or []
    return {"uuid": to_uuid(info["id"]), "tag": tag if tag is not None else (tags[0] if tags else None),
            "created_at": iso(info.get("created"))}


INTERVAL = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_time(value: str | None, name: str) -> float | None:
    """Contree's since/until: an interval ago (600s, 15m, 2h, 3d, 1w), a Unix time or ISO 8601."""
    if value is None or value == "":
        return None
    m = INTERVAL.match(value)
    if m:
        return time.time() - float(m[1]) * UNIT_S[m[2]]
    try:
        return float(value)
    except ValueError:
        pass
    try:
        t = dt.datetime.fromisoformat(value)
    except ValueError:
        raise InvalidInput(f"{name} must be an interval (15m), a Unix time or ISO 8601, not {value!r}") from None
    return (t if t.tzinfo else t.replace(tzinfo=dt.UTC)).timestamp()


def flag(value: str | None) -> bool:
    """Contree's HTTP-flag booleans: present without a value, or anything but 0, is on."""
    return value is not None and value not in ("0", "false")


# ---- operations -----------------------------------------------------------------------------------
def stream_repr(data: bytes, truncated: bool = False) -> dict:
    if all(32 <= b < 127 or b in (9, 10, 13) for b in data):
        return {"value": data.decode("ascii"), "encoding": "ascii", "truncated": truncated}
    return {"value": base64.b64encode(data).decode(), "encoding": "base64", "truncated": truncated}


def instance_result(outcome: dict, run) -> dict | None:
    """InstanceResult: the process's state, resources and output. Output is known only to the
    process that ran the operation (ours are not stored); elsewhere it is empty and truncated."""
    if run is None and "exit_code" not in outcome:
        return None
    src = run.__dict__ if run is not None else outcome
    usage = src.get("usage") or {}
    code, sig = src.get("exit_code"), src.get("signal")
    wall = float(usage.get("wall_s") or 0.0)
    out = stream_repr(run.stdout, run.stdout_truncated) if run else stream_repr(b"", True)
    err = stream_repr(run.stderr, run.stderr_truncated) if run else stream_repr(b"", True)
    return {"resources": {"block_input": 0, "block_output": 0, "cost": 0.0, "elapsed_time": wall,
                          "involuntary_switches": 0, "max_rss": int((usage.get("max_rss_bytes") or 0) // 1024),
                          "monotonic_time": wall, "page_faults": 0, "page_faults_io": 0, "shared_memory": 0,
                          "signals": 0, "swaps": 0, "system_cpu_time": float(usage.get("sys_cpu_s") or 0.0),
                          "unshared_memory": 0, "user_cpu_time": float(usage.get("user_cpu_s") or 0.0),
                          "voluntary_switches": 0},
            "state": {"continued": False, "core_dump": False,
                      "exit_code": code if code is not None else 128 + (sig or 0), "pid": 1, "signal": sig or 0,
                      "stopped": False, "timed_out": bool(src.get("timed_out"))},
            "stdout": out, "stderr": err}


def instance_metadata(rec: dict, run) -> dict:
    """OperationInstanceMetadata from the operation's record (a queued one records only its command)."""
    spec, outcome = rec.get("spec") or {}, rec.get("outcome") or {}
    argv = spec.get("argv")
    # a shell string is recorded as itself, an argv joined: that tells `sh -c X` from ["/bin/sh", "-c", X]
    if argv and len(argv) == 3 and argv[:2] == ["/bin/sh", "-c"] and spec.get("command") == argv[2]:
        command, args, shell = argv[2], [], True
    elif argv:
        command, args, shell = argv[0], argv[1:], False
    else:
        command, args, shell = spec.get("command", ""), [], True
    limits = spec.get("limits") or {}
    return {"command": command, "args": args, "shell": shell, "image": to_uuid(rec.get("source")),
            "cwd": spec.get("cwd", "/"), "env": spec.get("env") or {}, "hostname": spec.get("hostname", ""),
            "uid": spec.get("uid", 0), "gid": spec.get("gid", 0), "disposable": bool(spec.get("disposable")),
            "preserve_env": False, "files": {p: {} for p in spec.get("files") or []},
            "stdin": {"value": "", "encoding": "ascii"}, "timeout": int(limits.get("timeout") or 0),
            "truncate_output_at": int(limits.get("output") or 0),
            "result": instance_result(outcome, run) if rec.get("finished") else None}


def operation_view(rec: dict, run) -> dict:
    status = OP_STATUS.get(rec["status"], "FAILED")
    outcome = rec.get("outcome") or {}
    end = rec.get("finished") or time.time()
    usage = (run.usage if run is not None else outcome.get("usage")) or {}
    terminal = status in TERMINAL
    out = {"uuid": to_uuid(rec["id"]), "status": status,
           "error": outcome.get("message") if status == "FAILED" else None,
           "created_at": iso(rec.get("started")), "duration": round(end - (rec.get("started") or end), 6),
           "image_size": None,
           "consumed_cpu": (usage.get("user_cpu_s", 0) + usage.get("sys_cpu_s", 0)) if usage else None,
           "consumed_memory": int(usage["max_rss_bytes"] // 1024) if usage.get("max_rss_bytes") else None,
           "result_image_uuid": to_uuid(rec.get("result")) if status == "SUCCESS" else None}
    if rec.get("kind") == "run":
        out.update(kind="instance", image_uuid=to_uuid(rec.get("source")), metadata=instance_metadata(rec, run))
    else:
        spec = rec.get("spec") or {}
        source = str(spec.get("source", ""))
        url = "docker://" + source[5:] if source.startswith("pull:") else source
        out.update(kind="image_import", image_uuid=None,
                   metadata={"registry": {"url": url}, "tag": spec.get("tag"), "timeout": 0})
    tag = (rec.get("spec") or {}).get("tag") if rec.get("kind") != "run" and status == "SUCCESS" else None
    out["result"] = {"image": out["result_image_uuid"], "tag": tag} if terminal else None
    return out


def op_id(value: str) -> str:
    return from_uuid(value, "operation")


# ---- request bodies -------------------------------------------------------------------------------
class Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")     # clients newer than this adapter send more fields

    @model_validator(mode="before")
    @classmethod
    def _utf8(cls, v):
        return utf8_only(v)                     # (models.py: the REST bodies' same check)


class StreamIn(Lenient):
    value: str = ""
    encoding: str = Field("ascii", pattern="^(ascii|base64)$")
    close: bool = True


class FileSpecIn(Lenient):
    uuid: str
    mode: str = Field("0644", pattern="^0?[0-7]{3,4}$")
    uid: int = Field(0, ge=0)
    gid: int = Field(0, ge=0)

    @field_validator("mode", mode="before")
    @classmethod
    def octal(cls, v):
        """"0644", and what clients send besides: Python's oct(st_mode) ("0o100644", contree-mcp's
        rsync) or a number; only a regular file's type bits may come with it."""
        text = str(v).strip().lower() if not isinstance(v, int) else oct(v)
        m = re.fullmatch(r"0?o?([0-7]{3,7})", text)
        bits = int(m[1], 8) if m else -1
        if bits < 0 or bits & ~0o7777 not in (0, stat_mod.S_IFREG):
            raise ValueError(f"mode must be octal permission bits like 0644, not {v!r}")
        return f"{bits & 0o7777:04o}"




class LimitsIn(Lenient):
    max_layer_bytes: int | None = Field(None, ge=1)


class NetworkingIn(Lenient):
    enabled: bool = False          # Contree's own default is true; sandtree's is no network (set it)


class SpawnIn(Lenient):
    command: str = Field(min_length=1)
    image: str = Field(min_length=1)
    args: list[str] = []
    shell: bool = False
    env: dict[str, str | None] | None = None
    preserve_env: bool = False
    preserve_cwd: bool = False
    cwd: str = Field("", pattern=r"^((/[^/]*)+/?)?$")
    uid: int = Field(0, ge=0)
    gid: int = Field(0, ge=0)
    hostname: str | None = None
    disposable: bool = False
    stdin: StreamIn | None = None
    timeout: int | None = Field(None, ge=1)
    truncate_output_at: int | None = Field(None, ge=1, le=10 << 20)
    files: dict[str, FileSpecIn] | None = None
    resources_limits: LimitsIn | None = None
    networking: NetworkingIn | None = None


class CredentialsIn(Lenient):
    username: str = Field(min_length=1)
    password: str = Field(min_length=1)


class RegistryIn(Lenient):
    url: str = Field(min_length=1)
    credentials: CredentialsIn | None = None


class ImportIn(Lenient):
    registry: RegistryIn
    tag: str | None = None
    timeout: int = Field(300, ge=1)


class TagIn(Lenient):
    tag: str = Field(min_length=1)


RESOURCE_KEYS = ("user_time_us", "sys_time_us", "max_rss_kb", "shared_memory", "unshared_memory", "swaps",
                 "minor_faults", "major_faults", "voluntary_ctx_switches", "involuntary_ctx_switches",
                 "block_input_ops", "block_output_ops", "ipc_msgs_sent", "ipc_msgs_received", "signals_received")


def event_resources(usage: dict | None) -> dict:
    """EventResources from our usage (CPU times and max RSS are measured; the rest are 0)."""
    u = usage or {}
    out = dict.fromkeys(RESOURCE_KEYS, 0)
    out.update(user_time_us=int(float(u.get("user_cpu_s") or 0) * 1e6),
               sys_time_us=int(float(u.get("sys_cpu_s") or 0) * 1e6),
               max_rss_kb=int((u.get("max_rss_bytes") or 0) // 1024))
    return out


STEP = 8                      # our event n gives Contree events STEP*n .. STEP*n+STEP-1


def shutdown_reason(end: dict, cur: dict) -> str:
    """EventDataShutdown.reason of how a run ended."""
    if end.get("timed_out"):
        return "timeout"
    if end.get("signal") is not None or cur.get("status") == "cancelled":
        return "signal"
    if cur.get("status") == "failed":
        return "spawn_failed"
    return "job_complete"


def init_data(cur: dict, op: str) -> dict:
    """EventDataInit of a run's live sandbox (the sandbox's init is its process 1)."""
    u = os.uname()
    return {"started_at": iso(cur.get("started") or time.time()), "runtime_path": "/", "verbose": False,
            "init_pid": 1, "hostname": (cur.get("spec") or {}).get("hostname", "sandtree"),
            "kernel": f"{u.release} {u.version}", "machine": u.machine, "boot_id": to_uuid(op)}


def events_of(seq: int, kind: str, data: str, cur: dict | None) -> list[dict]:
    """Contree events for our event `seq` (`cur`: the operation's record, for all but output):
    ids STEP*seq + i (a start gives init and spawn; an end exit, shutdown and completion)."""
    now = dt.datetime.now(dt.UTC).isoformat()
    base = STEP * seq
    if kind in ("stdout", "stderr"):
        return [{"id": base, "ts": now, "spid": 1, "type": kind, "data": stream_repr(data.encode())}]
    if kind == "size_cap":
        return [{"id": base, "ts": now, "spid": 0, "type": "size_cap", "data": json.loads(data)}]
    if kind == "start" and cur.get("kind") != "run":
        return []                                        # an import: no process, only its completion
    if kind == "start":
        md = instance_metadata(cur, None)
        return [{"id": base, "ts": now, "spid": 0, "type": "init", "data": init_data(cur, cur["id"])},
                {"id": base + 1, "ts": now, "spid": 1, "type": "spawn",
                 "data": {"pid": 1, "command": md["command"], "args": md["args"], "shell": md["shell"],
                          "cwd": md["cwd"], "uid": md["uid"], "gid": md["gid"], "timeout": md["timeout"],
                          "truncate_at": md["truncate_output_at"], "env": md["env"]}}]
    end = json.loads(data) if kind == "end" else {}
    out = []
    ms = int(((cur.get("finished") or time.time()) - (cur.get("started") or time.time())) * 1000)
    if end.get("exit_code") is not None or end.get("signal") is not None:
        code, sig = end.get("exit_code"), end.get("signal")
        out.append({"id": base, "ts": now, "spid": 1, "type": "exit",
                    "data": {"pid": 1, "code": code if code is not None else 128 + sig,
                             "signal": sig if sig is not None else -1,
                             "timed_out": bool(end.get("timed_out")), "duration_ms": ms,
                             "resources": event_resources((cur.get("outcome") or {}).get("usage"))}})
    status = OP_STATUS.get(cur["status"], "FAILED")
    if cur.get("kind") == "run" and (out or status == "FAILED"):     # a sandbox was (or was to be) up
        out.append({"id": base + 1, "ts": now, "spid": 0, "type": "shutdown",
                    "data": {"stopped_at": iso(cur.get("finished") or time.time()),
                             "reason": shutdown_reason(end, cur)}})
    out.append({"id": base + 2, "ts": now, "type": "completion",
                "data": {"status": status, "duration_ms": ms,
                         "result_image_uuid": to_uuid(cur.get("result")) if status == "SUCCESS" else None,
                         "error": (cur.get("outcome") or {}).get("message") if status == "FAILED" else None}})
    return out


KIND_BITS = {"file": stat_mod.S_IFREG, "dir": stat_mod.S_IFDIR, "symlink": stat_mod.S_IFLNK,
             "char": stat_mod.S_IFCHR, "block": stat_mod.S_IFBLK, "fifo": stat_mod.S_IFIFO,
             "socket": stat_mod.S_IFSOCK}


def file_item(e: dict) -> dict:
    """Contree's FileItem from one of our directory entries (mode with its file-type bits)."""
    kind = e["type"]
    return {"path": e["name"], "size": e["size"], "owner": str(e["uid"]), "group": str(e["gid"]),
            "uid": e["uid"], "gid": e["gid"], "mode": KIND_BITS.get(kind, 0) | int(e["mode"], 8),
            "mtime": int(e.get("mtime") or 0), "nlink": 1, "is_dir": kind == "dir", "is_regular": kind == "file",
            "is_symlink": kind == "symlink", "is_socket": kind == "socket", "is_fifo": kind == "fifo",
            "symlink_to": e.get("target", "") if kind == "symlink" else ""}


def grep_match(h: dict, rx: str, ignore: bool) -> dict:
    text = h["text"]
    subs = [{"text": m.group(0), "start": m.start(), "end": m.end()}
            for m in re.finditer(rx, text, re.IGNORECASE if ignore else 0) if m.group(0)]
    line = text + "\n"
    return {"path": h["path"], "line_number": h["line"], "absolute_offset": 0, "line_text": line,
            "line_bytes": len(line.encode()), "submatches": [] if h.get("context") else subs,
            "type": "context" if h.get("context") else "match"}
