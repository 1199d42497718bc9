"""The vocabulary: what each parameter of the operations (and of the MCP tools, which name some
things their own way) means, said once. MCP tool parameters and REST fields take their descriptions
from here; a row's own `param: text` docstring lines override the shared meaning."""

from __future__ import annotations

from . import table
from .errors import MergeConflict, NodeLost, TapeMiss

__all__ = ["PARAMS", "describe"]

# Descriptions of the parameters that recur (MCP tool parameters and REST fields take them from here).
PARAMS = {
    "ref": "an image: its ID or a unique prefix of it, a tag, or branch:NAME",
    "image": "an image: its ID or a unique prefix of it, a tag, or branch:NAME",
    "root": "the image the tree starts from (ID, prefix, tag or branch:NAME)",
    "a": "the first image (ID, prefix, tag or branch:NAME)",
    "b": "the second image (ID, prefix, tag or branch:NAME)",
    "base": "the common ancestor (None: found from the lineage)",
    "ours": "the image whose side wins a conflict with strategy='ours'",
    "theirs": "the image merged into ours",
    "command": "a string runs in /bin/sh -c; a list is the argv",
    "path": "an absolute path inside the image or sandbox",
    "name": "a tag or branch name",
    "tag": "a tag to give the resulting image",
    "sid": "a live sandbox's ID (or a unique prefix)",
    "port": "a TCP port inside the sandbox (1-65535)",
    "ttl": "seconds until the signed URL stops working",
    "env": "environment variables added to the defaults (values that look like secrets are masked in records)",
    "cwd": "the working directory inside the sandbox (default: the image's WORKDIR, else /)",
    "stdin": "bytes or text fed to the command's standard input",
    "uid": "the user ID the command runs as inside the sandbox (default: the image's USER, else 0)",
    "gid": "the group ID the command runs as inside the sandbox",
    "hostname": "the sandbox's hostname",
    "files": "files put into the sandbox first: a list of {path, content | blob, mode} or {path: bytes | str}",
    "file_set": "the ID of a stored file set whose files are put in first",
    "disposable": "run without keeping the result as an image",
    "timeout": "seconds of wall clock before the command is killed",
    "memory": "memory limit, bytes or a size like 512M (processes plus pending writes)",
    "pids": "the most processes and threads at once",
    "cpus": "CPU quota in cores (None: no quota)",
    "disk": "bytes the run may write, or a size like 2G",
    "output": "bytes kept per output stream; a stream passing it stops the command",
    "tier": "isolation tier: namespaces (default) or gvisor",
    "limit": "the most entries returned",
    "op": "an operation's ID",
    "digest": "a sha256 hex digest of an uploaded file",
    "idle_timeout": "seconds without a command before the sandbox is stopped",
    "lifetime": "seconds until the sandbox is stopped in any case",
    "idle_action": "what the idle timeout does: stop, or hibernate (resume brings it back)",
    "containers": "run Docker's engine (dockerd from the image) inside: docker, docker build and docker compose "
                  "work in it; gvisor tier only",
    "force": "replace or remove even where it would otherwise be refused",
    "strategy": "how conflicts resolve: None (report them), 'ours' or 'theirs'",
    "ignore": "glob patterns of paths the merge leaves out (default: __pycache__/, *.pyc, .pytest_cache/)",
    "on_conflict": "'raise' (MergeConflict) or 'return' (the conflicts in the answer)",
    "insecure": "allow plain HTTP / unverified TLS to this registry",
    "max_nodes": "the most nodes in the answer",
    "reference": "docker://HOST[:PORT]/NAME[:TAG|@DIGEST]",
    "network": "outbound network: off (default), all (public internet), a rule list like "
               "['pypi.org', '*.pythonhosted.org:443', '203.0.113.0/24'] or {allow_out: [...], deny_out: [...]}; "
               "inherit: the policy of the run that made the image",
    "secrets": "NAME -> {value, hosts}, or NAME -> {stored: true, hosts?} / a list of NAMEs for the server's "
               "stored secrets (hosts may only narrow theirs): the sandbox sees a placeholder in $NAME; requests "
               "to those hosts carry the value (needs network)",
    "record": "keep an egress tape of what the sandbox fetched (DNS, HTTP and HTTPS exchanges, other TCP as "
              "byte streams; needs network): its ID is in the run's usage['tape']; with replay: misses go out "
              "and the new tape extends the old one",
    "replay": "a tape ID (or {tape, ignore_headers, ignore_query, match_headers}): DNS and requests answered "
              f"from it, nothing goes out; a request not on it fails the run ({TapeMiss.code}) naming it",
    "tape": "an egress tape's ID (a run's usage['tape'])",
    "retries": "on a cluster: run it again on another node, at most this many times, when its node is lost "
               f"before the run committed anything (0: it fails with {NodeLost.code})",
    "secret_set.name": "the secret's name: the environment variable runs see it as",
    "secret_remove.name": "the stored secret's name",
    "value": "the secret's value (UTF-8, 4 bytes to 16 KiB, no CR, LF or NUL); never shown again",
    "hosts": "the host names (or *.domain) the value may be sent to",
    "tenants": "(the operator's secrets) the tenants that may use it by name, '*': every tenant",
    "tenant": "a tenant's name (an admin asking about that tenant; a tenant may name only itself)",
    "labels": "names and values kept with it (E2B's metadata): at most 64, names of letters, digits and _.-/",
    "pattern": "an RE2 regular expression (linear time: no backtracking)",
    "size": "sandboxes kept started (0 empties the pool)",
    "signal": "a number or a name (TERM, SIGTERM)",
    # the MCP tools' own names for the same things
    "sandbox_id": "a live sandbox's ID (from sandbox_start)",
    "operation_id": "an operation's ID (from run with wait=false, or a result's operation_id)",
    "operation_ids": "operation IDs to wait for",
    "directory_state_id": "a file set's ID (from rsync): its files are put in first",
    "shell": "true: a string command runs with /bin/sh -c; false: it is split as a shell would (quotes kept) and run without one",
    "wait": "false: return the operation_id at once (see wait_operations)",
    "truncate_output_at": "characters of stdout and stderr returned (the rest: get_operation with an offset)",
    "offset": "where to start reading (bytes, or characters of a stored output)",
    "commands": "the commands, one branch each, all from the same image",
    "parallel": "how many branches run at once",
    "content": "the file's text",
    "content_base64": "the file's bytes as base64 (instead of content)",
    "mode": "the file's permission bits (e.g. 420 = 0o644)",
    "all": "include stopped sandboxes",
    "status": "only operations in this state: queued, running, done, failed, cancelled",
    "tag_prefix": "only images with a tag starting with this",
    "glob": "only files whose path matches this glob",
    "exclude": "glob patterns of paths left out",
    "ignore_case": "match regardless of case",
    "max_matches": "the most matching lines returned",
    "branch": "a branch's name",
    "steps": "how many runs back along the branch's log",
    "to": "an image on the branch's log to move its head to",
    "registry_url": "the registry, e.g. https://registry.example.com",
    "username": "the registry account",
    "token": "the registry password or token (stored, never shown or logged)",
    "setup_commands": "shell commands that prepare the environment, one per line",
    "test_command": "the command whose exit status says whether a candidate works",
    "candidates": "how many alternatives to try in parallel",
    # meanings of one tool's own
    "import_image.source": "docker://HOST/NAME:TAG, upload:SHA256 (an uploaded tar), a local path (stdio only) "
                           "or debian:SUITE",
    "rsync.source": "a directory on this machine (stdio only)",
    "rsync.destination": "the directory inside the sandbox the files go to",
    "download.destination": "a path on this machine to write the file to (stdio only)",
    "upload.path": "a file on this machine to upload (stdio only; instead of content)",
    "sandbox_list.labels": "only sandboxes carrying every one of these labels",
    "sandbox_port.close": "true: unexpose the port (unreachable again)",
    "sandbox_port.url_ttl": "also return a signed URL that works without a token for this many seconds",
    "lineage.format": "text (an indented tree) or json",
    "diff.patch": "also return a unified diff of the text files",
    "merge.return_conflicts": f"return the conflicts instead of failing with {MergeConflict.code}",
    "get_guide.section": "workflow, branching, async, live or errors",
    "prepare_environment.base": "the image to start from",
    "prepare_environment.tag": "the tag the prepared image gets",
}


def describe(name: str, param: str) -> str | None:
    """A parameter's description: the row's own (`param: text` lines in its docstring), else the
    vocabulary's meaning for this tool (`name.param`), else the shared one."""
    row = table.OPS.get(name)
    if row is not None:
        for line in row.doc.splitlines():
            if line.strip().startswith(f"{param}:"):
                return line.split(":", 1)[1].strip()
    return PARAMS.get(f"{name}.{param}", PARAMS.get(param))
