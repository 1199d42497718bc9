"""What an audit row says about a call, from the operation's table row, its arguments and its
answer: one rule for a tenant and an admin alike, so an operation with an `audit` action in the
table is recorded the same way whoever calls it (nothing is audited by a list of names)."""

from __future__ import annotations

from ..secrets_mask import mask_text, secret_values
from ..store.names import HEX_RE
from ..defaults import RunRecord
from ..table import Op

# Where an answer that is an image goes (default: `result`, the image the call made).
ANSWER = {
    "untag": "image", "branch_delete": "image",              # the image the removed name pointed at
    "sandbox_commit": "both", "sandbox_hibernate": "both",   # the sandbox's state: its subject and its result
}
# Where in a dict answer the image a call made is.
RESULT_KEY = {"sandbox_hibernate": "head", "merge": "image"}
# The argument that names the ref a row writes, by the detail key it is recorded under.
REF_KEY = {"tag": "tag", "untag": "tag", "branch_create": "branch", "branch_delete": "branch", "rollback": "branch"}


def masked(command, env) -> str:
    """A command as the audit keeps it: values of secret-looking variables masked."""
    text = command if isinstance(command, str) else " ".join(map(str, command or []))
    return mask_text(text, secret_values({str(k): str(v) for k, v in (env or {}).items()}))


def _image(value) -> str | None:
    return value if isinstance(value, str) and HEX_RE.match(value) else None


def entry(row: Op, args: dict, answer) -> dict:
    """The audit row's image, result, operation and detail for `row` called with `args`."""
    image = next((args[a] for a in row.images if _image(args.get(a))), None)
    result = op = None
    detail: dict = {}
    if isinstance(answer, str):
        result = _image(answer)
    elif isinstance(answer, dict) and row.name == "sandbox_start":
        image, detail["sandbox"] = answer.get("image"), answer.get("id")
    elif isinstance(answer, dict) and row.name in RESULT_KEY:
        result = _image(answer.get(RESULT_KEY[row.name]))
    elif isinstance(answer, RunRecord):                                  # a run's or an exec's record
        image, result, op = answer.source, answer.image, answer.op
    elif row.name in ("build", "build_context") and answer is not None:  # a BuildResult
        result = _image(answer.image)
        detail.update(steps=len(answer.steps), cached=sum(1 for s in answer.steps if s.cached))
    if isinstance(args.get("op"), str):                                # a call on an operation
        op = args["op"]
    where = ANSWER.get(row.name)
    if where is not None and result is not None:
        image, result = result, (result if where == "both" else None)
    if "sid" in args:
        detail["sandbox"] = args["sid"]
    if row.name in ("sandbox_remove", "sandbox_mkdir"):
        detail["path"] = args["path"]
    if row.name == "sandbox_rename":
        detail.update(path=args["source"], destination=args["destination"])
    if "port" in args:
        detail["port"] = args["port"]
    if "command" in args or "argv" in args:
        detail["command"] = masked(args.get("command", args.get("argv")), args.get("env"))
    if row.name == "sandbox_popen":
        detail["interactive"] = True
    if row.name in REF_KEY:
        detail[REF_KEY[row.name]] = args["name"]
    elif args.get("tag") is not None:
        detail["tag"] = args["tag"]
    if row.name == "merge":
        image = args["ours"]
        detail.update(theirs=args["theirs"], base=args["base"], strategy=args["strategy"],
                      conflicts=len(answer["conflicts"]))
    return {"image": image, "result": result, "op": op, "detail": detail}
