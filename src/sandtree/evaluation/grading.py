"""What the `swebench` package decides, taken from it rather than rewritten: the ordered patch
commands (run_evaluation.GIT_APPLY_CMDS), the log markers and file names (harness.constants), the
eval script's exit-code recording (utils.make_test_spec), the log parsers (PARSER_REGISTRY), the
grading (grading.get_eval_report: get_logs_eval -> get_eval_tests_report -> get_resolution_status)
and the per-instance logger (logger.setup_logger). Our instances are not in swebench's
MAP_REPO_TO_PARSER, so each becomes a swebench TestSpec naming its parser (default
parse_log_pytest) and eval type (fail_only for swebench's FAIL_ONLY_REPOS), and swebench grades the
log through it as it grades its own instances.

The eval script has the shape swebench's Python instances have (swebench/harness/test_spec/python.py,
make_eval_script_list): show the tree's state, reset the test files the test patch touches, apply
the test patch from a heredoc, run the test command between the start/end markers, reset the test
files again. Two departures, both because /testbed is one commit of a release's sdist (no history):
the base is HEAD unless the instance names a base_commit, and `git show` prints the commit's
header only (its diff would be the whole source tree).

Loading this module imports swebench (about 1.5 s): sandtree.evaluation loads it on first use."""

from __future__ import annotations

import shlex

from swebench import logger as swebench_logger
from swebench.harness import constants as C
from swebench.harness import infra_failure
from swebench.harness.grading import get_eval_report
from swebench.harness.log_parsers import PARSER_REGISTRY
from swebench.harness.run_evaluation import GIT_APPLY_CMDS
from swebench.harness.utils import make_test_spec
from swebench.image_builder.constants import CONTAINER_WORKDIR
from swebench.utils import generate_heredoc_delimiter, get_modified_files

from ..errors import InvalidInput
from .inputs import Instance

__all__ = ["APPLY_PATCH_FAIL", "APPLY_PATCH_PASS", "PATCH_FILE", "END_TEST_OUTPUT", "LOG_INSTANCE", "LOG_REPORT",
           "LOG_TEST_OUTPUT", "START_TEST_OUTPUT", "WORKDIR", "APPLY_COMMANDS", "RESET_COMMAND",
           "REVERSE_CHECK", "DEFAULT_PARSER", "check", "eval_script", "test_spec", "grade", "classify",
           "TIER_ENVIRONMENT", "setup_logger", "close_logger"]

# swebench's names, bound here for the harness (one place says where each comes from)
APPLY_PATCH_FAIL, APPLY_PATCH_PASS = C.APPLY_PATCH_FAIL, C.APPLY_PATCH_PASS
START_TEST_OUTPUT, END_TEST_OUTPUT = C.START_TEST_OUTPUT, C.END_TEST_OUTPUT
LOG_INSTANCE, LOG_REPORT, LOG_TEST_OUTPUT = C.LOG_INSTANCE, C.LOG_REPORT, C.LOG_TEST_OUTPUT
TIER_ENVIRONMENT = infra_failure.TIER_ENVIRONMENT
setup_logger, close_logger = swebench_logger.setup_logger, swebench_logger.close_logger
PATCH_FILE = C.CONTAINER_PATCH_FILE        # /tmp/patch.diff
WORKDIR = CONTAINER_WORKDIR                # /testbed
DEFAULT_PARSER = "parse_log_pytest"
# Each fallback as argv (docker's exec splits the harness's strings the same way), patch file last.
APPLY_COMMANDS = [shlex.split(c) + [PATCH_FILE] for c in GIT_APPLY_CMDS]
# swebench's reset between attempts: a failed one (--reject) leaves partial state behind
RESET_COMMAND = ["/bin/bash", "-c", "git checkout -- . ; git clean -fd"]
REVERSE_CHECK = ["git", "apply", "--check", "--reverse", PATCH_FILE]


def check(inst: Instance) -> None:
    """What swebench would refuse later, refused before anything runs."""
    parser = inst.log_parser or DEFAULT_PARSER
    if parser not in PARSER_REGISTRY:
        raise InvalidInput(f"{inst.instance_id}: log_parser {parser!r} is not one of swebench's parsers",
                           instance_id=inst.instance_id, field="log_parser")
    try:
        get_modified_files(inst.test_patch)
    except Exception as e:                   # unidiff's own errors: the test patch is not a diff
        raise InvalidInput(f"{inst.instance_id}: test_patch is not a unified diff: {e}",
                           instance_id=inst.instance_id, field="test_patch") from None


def eval_script(inst: Instance) -> str:
    """The eval script, in swebench's Python shape (see the module docstring)."""
    base = inst.base_commit or "HEAD"
    files = get_modified_files(inst.test_patch)
    reset = [f"git checkout {shlex.quote(base)} {' '.join(shlex.quote(f) for f in files)}"] if files else []
    delim = generate_heredoc_delimiter(inst.test_patch)
    lines = [
        "#!/bin/bash",
        "set -uxo pipefail",
        f"cd {WORKDIR}",
        f"git config --global --add safe.directory {WORKDIR}",
        f"cd {WORKDIR}",
        "git status",
        "git show --no-patch",
        f"git -c core.fileMode=false diff {shlex.quote(base)}",
        *reset,
        f"git apply -v - <<'{delim}'\n{inst.test_patch}\n{delim}",
        f": '{START_TEST_OUTPUT}'",
        inst.test_cmd,
        f": '{END_TEST_OUTPUT}'",
        *reset,
    ]
    return "\n".join(lines) + "\n"


def test_spec(inst: Instance, image: str):
    """swebench's TestSpec of an instance (its eval script with the test command's exit status
    recorded after the end marker, by swebench's own make_test_spec)."""
    return make_test_spec({
        "instance_id": inst.instance_id, "image": image, "repo": inst.repo, "version": inst.version,
        "FAIL_TO_PASS": list(inst.FAIL_TO_PASS), "PASS_TO_PASS": list(inst.PASS_TO_PASS),
        "log_parser": inst.log_parser or DEFAULT_PARSER,
        "eval_type": (C.EvalType.FAIL_ONLY if inst.repo in C.FAIL_ONLY_REPOS else C.EvalType.PASS_AND_FAIL).value,
        "eval_script": eval_script(inst),
    })


def grade(spec, prediction: dict, test_output_path: str) -> dict:
    """swebench's report of one instance from its test log ({instance_id: {...}})."""
    return get_eval_report(test_spec=spec, prediction=prediction, test_log_path=test_output_path,
                           include_tests_status=True)


def classify(*paths) -> tuple[str, str] | None:
    """swebench's infrastructure-failure classification of an instance's logs: (reason, tier)."""
    return infra_failure.classify_logs(*paths)
