"""The eval's inputs, checked before anything runs: instances in SWE-bench's schema (plus our
`environment` and `test_cmd`) and predictions (`instance_id`, `model_name_or_path`, `model_patch`),
from JSONL (or, for predictions, a JSON list or dict as swebench takes them) or from Python values.

Everything here is untrusted: a file's size, each line's size, every field's type and size, and the
names that become paths and tags (an instance ID is a directory and `eval/<instance_id>`; a model
name, with `/` written `__` as swebench does, and the run ID are directories) are checked first,
and a bad input raises InvalidInput naming the line and field before any build or run starts."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

from ..errors import InvalidInput, TooLarge
from ..values import parse_size

__all__ = ["Instance", "Prediction", "load_instances", "load_predictions", "check_name", "check_limits",
           "model_dir", "MAX_FILE_BYTES", "MAX_LINE_BYTES", "MAX_PATCH_BYTES", "MAX_TESTS", "MAX_TEST_ID", "MAX_TEXT_BYTES",
           "NAME_RE", "LIMITS"]

MAX_FILE_BYTES = 256 << 20        # an instances or predictions file (SWE-bench's whole test split is ~100 MB)
MAX_LINE_BYTES = 32 << 20         # one JSONL line
MAX_PATCH_BYTES = 8 << 20         # a patch, a test_patch or a model_patch
MAX_TEXT_BYTES = 1 << 20          # a Dockerfile (the builder's own cap), a test command, a problem statement
MAX_TESTS = 100_000               # node IDs in FAIL_TO_PASS + PASS_TO_PASS
MAX_TEST_ID = 4096                # characters of one test node ID
# An instance ID, a run ID or a model directory: one path component and part of a tag (store/names.py
# TAG_RE allows these characters), never `.`/`..`, no separator, no leading dash.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,99}$")


@dataclass(frozen=True)
class Instance:
    instance_id: str
    repo: str
    version: str
    base_commit: str | None
    patch: str | None             # the gold fix (needed only to validate with it)
    test_patch: str
    FAIL_TO_PASS: tuple[str, ...]
    PASS_TO_PASS: tuple[str, ...]
    test_cmd: str
    environment: dict             # {"dockerfile": TEXT} or {"image": REF}
    log_parser: str | None = None     # a name of swebench's PARSER_REGISTRY (default parse_log_pytest)

    def environment_key(self) -> tuple:
        """Instances with equal keys share one environment image (built once per run)."""
        return tuple(sorted(self.environment.items()))


@dataclass(frozen=True)
class Prediction:
    instance_id: str
    model_name_or_path: str
    model_patch: str | None

    def to_dict(self) -> dict:
        return {"instance_id": self.instance_id, "model_name_or_path": self.model_name_or_path,
                "model_patch": self.model_patch}


LIMITS = ("memory", "cpus", "pids", "disk")


def check_limits(limits) -> dict:
    """The test runs' resources, checked before anything is built or run: memory and disk sizes
    ("2G" or bytes), cpus a positive number, pids a positive whole number; None: the engine's."""
    if limits is None:
        return {}
    if not isinstance(limits, dict):
        raise InvalidInput("limits is a mapping of " + ", ".join(LIMITS))
    unknown = sorted(str(k) for k in limits if k not in LIMITS)
    if unknown:
        raise InvalidInput(f"unknown limit(s): {', '.join(unknown)} (from: {', '.join(LIMITS)})")
    out = {k: v for k, v in limits.items() if v is not None}
    for k, v in out.items():
        if k in ("memory", "disk"):
            try:
                parse_size(v)
            except InvalidInput as e:
                raise InvalidInput(f"{k}: {e.message}") from None
        elif isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0 or (k == "pids" and v != int(v)):
            raise InvalidInput(f"{k} must be a positive {'whole ' if k == 'pids' else ''}number, not {v!r}")
    return out


def check_name(value, what: str) -> str:
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise InvalidInput(f"{what} must be 1-100 characters of letters, digits and ._@+- (starting with a "
                           f"letter or digit): {str(value)[:120]!r}", field=what)
    return value


def model_dir(model: str) -> str:
    """The directory of a model's logs: swebench's (`/` written `__`), checked as one path component."""
    if not isinstance(model, str):
        raise InvalidInput("model_name_or_path must be a string", field="model_name_or_path")
    return check_name(model.replace("/", "__"), "model_name_or_path")


def _read_records(source, what: str, *, whole_json: bool = False) -> list:
    """Records from a path (JSONL, or one JSON value when whole_json), or the list given."""
    if not isinstance(source, (str, os.PathLike)):
        if isinstance(source, dict) and whole_json:
            return list(source.values())
        if not isinstance(source, (list, tuple)):
            raise InvalidInput(f"{what}: a path to a JSONL file or a list of dicts")
        return list(source)
    path = os.fspath(source)
    try:
        size = os.stat(path).st_size
        if size > MAX_FILE_BYTES:
            raise TooLarge(f"{path}: {size} bytes, more than {MAX_FILE_BYTES} for a {what} file", path=path)
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise InvalidInput(f"{what}: cannot read {path}: {e.strerror}", path=path) from None
    if len(data) > MAX_FILE_BYTES:
        raise TooLarge(f"{path}: more than {MAX_FILE_BYTES} bytes for a {what} file", path=path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidInput(f"{path}: not UTF-8 (byte {e.start})", path=path) from None
    if whole_json and path.endswith(".json"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise InvalidInput(f"{path}: not JSON: {e}", path=path) from None
        if isinstance(value, dict):
            value = list(value.values())                 # {instance_id: prediction}, as swebench takes it
        if not isinstance(value, list):
            raise InvalidInput(f"{path}: a JSON list (or dict) of predictions", path=path)
        return value
    out = []
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        if len(line) > MAX_LINE_BYTES:
            raise TooLarge(f"{path}:{n}: a line over {MAX_LINE_BYTES} bytes", path=path, line=n)
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise InvalidInput(f"{path}:{n}: not JSON: {e.msg}", path=path, line=n) from None
    return out


def _text(rec: dict, key: str, where: str, *, limit: int, required: bool = True, null: bool = False):
    value = rec.get(key)
    if value is None and (null or not required):
        if required and key not in rec:
            raise InvalidInput(f"{where}: {key} is missing", field=key)
        return None
    if not isinstance(value, str):
        raise InvalidInput(f"{where}: {key} must be a string, not {type(value).__name__}", field=key)
    if len(value.encode("utf-8", "surrogatepass")) > limit:
        raise TooLarge(f"{where}: {key} is over {limit} bytes", field=key)
    if "\x00" in value:
        raise InvalidInput(f"{where}: {key} holds a NUL byte", field=key)
    return value


def _tests(rec: dict, key: str, where: str) -> tuple[str, ...]:
    value = rec.get(key)
    if isinstance(value, str):               # SWE-bench's own datasets keep these as JSON text
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise InvalidInput(f"{where}: {key} is a string that is not a JSON list", field=key) from None
    if not isinstance(value, list) or not all(isinstance(t, str) and 0 < len(t) <= MAX_TEST_ID for t in value):
        raise InvalidInput(f"{where}: {key} must be a list of test IDs (non-empty strings of at most "
                           f"{MAX_TEST_ID} characters)", field=key)
    return tuple(value)


def _environment(rec: dict, where: str) -> dict:
    env = rec.get("environment")
    if not isinstance(env, dict) or len(env) != 1 or not set(env) <= {"dockerfile", "image"}:
        raise InvalidInput(f'{where}: environment must be {{"dockerfile": TEXT}} or {{"image": REF}}',
                           field="environment")
    key = next(iter(env))
    return {key: _text(env, key, f"{where}: environment", limit=MAX_TEXT_BYTES if key == "dockerfile" else 512)}


def _instance(rec, where: str) -> Instance:
    if not isinstance(rec, dict):
        raise InvalidInput(f"{where}: an instance must be a JSON object")
    iid = check_name(rec.get("instance_id"), f"{where}: instance_id")
    where = f"{where} ({iid})"
    base = _text(rec, "base_commit", where, limit=256, required=False)
    if base is not None and not re.match(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$", base):
        raise InvalidInput(f"{where}: base_commit is not a commit or ref name", field="base_commit")
    f2p, p2p = _tests(rec, "FAIL_TO_PASS", where), _tests(rec, "PASS_TO_PASS", where)
    if len(f2p) + len(p2p) > MAX_TESTS:
        raise TooLarge(f"{where}: more than {MAX_TESTS} tests", field="PASS_TO_PASS")
    parser = _text(rec, "log_parser", where, limit=100, required=False)
    return Instance(
        instance_id=iid, repo=_text(rec, "repo", where, limit=256), version=str(rec.get("version", ""))[:64],
        base_commit=base, patch=_text(rec, "patch", where, limit=MAX_PATCH_BYTES, required=False),
        test_patch=_text(rec, "test_patch", where, limit=MAX_PATCH_BYTES), FAIL_TO_PASS=f2p, PASS_TO_PASS=p2p,
        test_cmd=_text(rec, "test_cmd", where, limit=MAX_TEXT_BYTES), environment=_environment(rec, where),
        log_parser=parser)


def load_instances(source) -> list[Instance]:
    """Instances from a JSONL path or a list of dicts; each checked (InvalidInput names the first
    bad one), IDs unique."""
    recs = _read_records(source, "instances")
    out, seen = [], set()
    for n, rec in enumerate(recs, 1):
        inst = rec if isinstance(rec, Instance) else _instance(rec, f"instance {n}")
        if inst.instance_id in seen:
            raise InvalidInput(f"instance {n}: instance_id {inst.instance_id} appears twice",
                               instance_id=inst.instance_id)
        seen.add(inst.instance_id)
        out.append(inst)
    if not out:
        raise InvalidInput("no instances given")
    return out


def load_predictions(source) -> list[Prediction]:
    """Predictions from a path (.jsonl, or .json: a list or an {instance_id: prediction} dict), a
    list or a dict of dicts; each checked, one per instance."""
    recs = _read_records(source, "predictions", whole_json=True)
    out, seen = [], set()
    for n, rec in enumerate(recs, 1):
        if isinstance(rec, Prediction):
            rec = rec.to_dict()
        where = f"prediction {n}"
        if not isinstance(rec, dict):
            raise InvalidInput(f"{where}: a prediction must be a JSON object")
        iid = check_name(rec.get("instance_id"), f"{where}: instance_id")
        model = rec.get("model_name_or_path")
        model_dir(model)
        if len(model) > 200:
            raise InvalidInput(f"{where}: model_name_or_path is over 200 characters", field="model_name_or_path")
        patch = _text(rec, "model_patch", f"{where} ({iid})", limit=MAX_PATCH_BYTES, null=True)
        if iid in seen:
            raise InvalidInput(f"{where}: a second prediction for {iid}", instance_id=iid)
        seen.add(iid)
        out.append(Prediction(iid, model, patch))
    return out
