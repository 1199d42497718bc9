"""The operation table: every engine operation declared once (Firecracker's single action vocabulary). Each row is
a declaration: a signature (a function whose body is only its docstring), the token scope a tenant needs, which
arguments name images (a tenant may name only images it sees), the audit action, and the HTTP binding. From the
rows come the tenant and admin views (tenancy/), the remote client (client/remote.py), MCP parameter
descriptions (vocabulary.py), and the conformance test that Engine, the tenant view and the remote client expose
the same operations with the same signatures (tests/test_conformance.py). The engine implements each row as a
method of the same name and signature; nothing here runs one. What a row is: rows.py. Imports only defaults.py
and rows.py (the remote client loads it)."""

from __future__ import annotations

from .. import defaults as D
from . import rows
from .options import RunOptions

# What a row is (rows.py), named here too: the table's readers know one module.
Http, Off, Op, OPS, SURFACES, op, via = rows.Http, rows.Off, rows.Op, rows.OPS, rows.SURFACES, rows.op, rows.via

__all__ = ["Http", "Off", "Op", "OPS", "SURFACES", "ENGINE_OPS", "OPERATIONS_OPS", "RunOptions", "op", "via"]

_G, _P, _U, _X, _LOCAL_HOST = "GET", "POST", "PUT", "DELETE", "it reads or writes paths of the server's own machine"

# ---- names, images, refs -------------------------------------------------------------------------
@op("list", http=Http(_G, "/resolve", query=("ref",), result="image"))
def resolve(ref: str) -> str:
    """The full image ID a reference names."""

@op("list", http=Http(_G, "/images", name="list_images"))
def images() -> list[dict]:
    """Every image (a tenant: the ones it may see)."""

@op("tag", images=("image",), audit="tag", http=Http(_U, "/tags/{name:path}", body=("image",), name="set_tag", model="TagIn", echo={"name": "tag", "image": "image"}))
def tag(image: str, name: str) -> None:
    """Point tag `name` at an image (moves an existing tag)."""

@op("tag", images=("image",), audit="annotate", http=Http(_P, "/images/{image:path}/annotations", body=("score", "meta"), model="AnnotateIn"))
def annotate(image: str, score: float | None = None, meta: dict | None = None) -> dict:
    """Merge a score and metadata (key -> JSON scalar; null removes a key) into your annotations of an image; returns them."""

@op("tag", audit="untag", http=Http(_X, "/tags/{name:path}", result="image", name="delete_tag", echo={"name": "tag"}))
def untag(name: str) -> str:
    """Remove a tag; returns the image it named."""

@op("list", images=("image",), http=Http(_G, "/tags", query=("image",)))
def tags(image: str | None = None) -> dict[str, str]:
    """Tag -> image (only an image's own tags when `image` is given)."""

@op("list", images=("image",), http=Http(_G, "/images/{image:path}", name="get_image", names={"image": "ref"}))
def image_info(image: str) -> dict:
    """An image's row: id, parents, size, creation time, tags, annotations."""

@op(None, admin=True, images=("image",), audit="remove image", http=Http(_X, "/images/{image:path}", query=("force",), names={"image": "ref"}, echo={"image": "removed"}))
def remove_image(image: str, *, force: bool = False) -> None:
    """Remove an image (its data goes at the next gc); refused while tags or children name it unless force."""

@op("tag", images=("image",), audit="share", caller=True, http=Http(_P, "/images/{image:path}/share", const={"public": True}, names={"image": "ref"}, model="ShareIn", doc="Make an image (one the caller owns) visible to every tenant by its ID, or stop that."))
def share(image: str) -> dict:
    """Make an image visible to every tenant."""

@op("tag", images=("image",), audit="unshare", caller=True, http=Http(_P, "/images/{image:path}/share", const={"public": False}, names={"image": "ref"}))
def unshare(image: str) -> dict:
    """Make a shared image private to its owners again."""

# ---- import ---------------------------------------------------------------------------------------
@op("import", audit="import", http=Http(_P, "/images/import", query=("tag",), drop=("progress",), name="import_tar", status=201, handler="import_tar"), custom_remote=True)
def import_path(path: str, *, tag: str | None = None, progress=None) -> str:
    """Import a directory, tar, OCI layout or docker-archive; returns the image ID.
    path: a directory or archive file (over HTTP: the client's own, sent as a tar)"""

@op("import", audit="pull", http=Http(_P, "/images/pull", body=("reference", "tag", "insecure"), result="image", drop=("progress",), status=201, model="PullIn", echo={"tag": "tag"}, describe={"insecure": "plain HTTP to the registry (a test registry on loopback)"}))
def pull(reference: str, *, tag: str | None = None, insecure: bool = False, progress=None) -> str:
    """Pull docker://HOST/NAME:TAG from an OCI registry; returns the image ID.
    reference: docker://HOST[:PORT]/NAME[:TAG|@DIGEST]"""

@op(None, admin=True, audit="registry login",
    http=Http(_P, "/registries/login", body=("registry_url", "username", "secret", "insecure"), result="registry",
              rename={"registry_url": "registry", "secret": "token"}, model="LoginIn", describe={"insecure": "plain HTTP to this registry (a test registry on loopback)"}))
def registry_login(registry_url: str, username: str, secret: str, *, insecure: bool = False) -> str:
    """Store credentials for a registry (the secret is never returned or logged)."""

@op(None, http=Http(_G, "/registries/host", query=("reference",), result="registry"))
def registry_host(reference: str) -> str:
    """The registry a URL or image reference names (docker://ghcr.io/org/x -> ghcr.io)."""

@op(None, admin=True, images=("image",), audit="push",
    http=Http(_P, "/images/{image:path}/push", body=("reference", "insecure"), drop=("progress",), names={"image": "ref"}, model="PushIn", describe={"insecure": "plain HTTP to the registry (a test registry on loopback)", "reference": "docker://HOST[:PORT]/NAME[:TAG]"}))
def push(image: str, reference: str, *, insecure: bool = False, progress=None) -> dict:
    """Push an image to docker://HOST[:PORT]/NAME[:TAG] (admin: with the server's stored credentials)."""
@op("list", images=("image",), http=Http(_G, "/images/{image:path}/oci", query=("name",), names={"image": "ref"}, handler="export_oci"), custom_remote=True)
def export_oci(image: str, fileobj, *, name: str | None = None) -> dict:
    """Write an image as an OCI image layout (a tar) to a file object. name: the index's ref name."""

@op(None, admin=True, local="it runs debootstrap on the server's machine: use `sandtree image bootstrap` there")
def bootstrap(spec: str, *, include: list[str] = (), tag: str | None = None, log=None, mirror: str | None = None) -> str:
    """Build a Debian base image with debootstrap (spec: SUITE, e.g. bookworm)."""

# ---- uploads and file sets --------------------------------------------------------------------------
@op("run", http=Http(_P, "/files", content="data", result="sha256", status=201, handler="upload"))
def upload(data: bytes) -> str:
    """Store bytes for later runs; returns their sha256."""

@op("run", local=_LOCAL_HOST)
def upload_file(path: str, digest: str | None = None) -> str:
    """Store a file of this machine (streamed); returns its sha256."""

@op("list", http=Http(_G, "/files/{digest}/info", names={"digest": "sha256"}, doc="An upload's size and time (the caller's own upload, or 404)."))
def upload_info(digest: str) -> dict:
    """An upload's size and time."""

@op("list", caller=True, http=Http(_G, "/files", query=("limit", "offset"), doc="Uploaded files (sha256, size, created), newest first."))
def uploads(*, limit: int = 100, offset: int = 0) -> list[dict]:
    """Uploaded files (sha256, size, created), newest first (a tenant: its own)."""

@op("list", local="the server answers it per request")
def find_upload(prefix: str) -> str:
    """The one upload whose digest starts with `prefix`."""

@op("list", http=Http(_G, "/files/{digest}", raw=True, names={"digest": "sha256"}, handler="download"))
def download(digest: str) -> bytes:
    """An upload's bytes."""

@op("run", http=Http(_P, "/file-sets", whole_body="files", result="id", name="file_set", status=201, doc='A reusable set of uploaded files ({"path", "sha256", "mode"}); its ID is its content hash.'))
def file_set_create(files: list[dict]) -> str:
    """Store a set of files ({path, content | blob, mode}) to put into runs; returns its ID."""

@op("list", local="the server answers it per request")
def file_set(set_id: str) -> list[dict]:
    """A stored file set's files."""

# ---- inspection ----------------------------------------------------------------------------------
@op("list", images=("image",), http=Http(_G, "/images/{image:path}/ls", query=("path",), data=True, names={"image": "ref"}))
def ls(image: str, path: str = "/") -> list[dict]:
    """The entries of a directory of an image."""

@op("list", images=("image",), http=Http(_G, "/images/{image:path}/stat", query=("path",), data=True, names={"image": "ref"}))
def stat(image: str, path: str) -> dict:
    """One path's metadata."""

@op("list", images=("image",), http=Http(_G, "/images/{image:path}/read", query=("path", "offset", "limit"), raw=True, names={"image": "ref"}, handler="read"))
def read(image: str, path: str, offset: int = 0, limit: int | None = None) -> bytes:
    """A file's bytes (from `offset`, at most `limit`)."""

@op("list", images=("image",), http=Http(_G, "/images/{image:path}/grep", query=("pattern", "path"), names={"image": "ref"}, handler="grep"))
def grep(image: str, pattern: str, path: str = "/", **kw) -> list[dict]:
    """Lines matching an RE2 pattern under a path.
    pattern: an RE2 regular expression (no backtracking: linear time)"""

@op("list", images=("image",), http=Http(_G, "/images/{image:path}/export", query=("path",), names={"image": "ref"}, name="export", handler="export"), custom_remote=True)
def export_tar(image: str, fileobj, path: str = "/") -> None:
    """Write an image (or one directory of it) as a tar to a file object."""

@op("list", images=("a", "b"), http=Http(_G, "/diff", query=("a", "b"), result="changes", data=True, echo={"a": "a", "b": "b"}))
def diff(a: str, b: str) -> list:
    """What changed from image a to image b (added, deleted, modified, ...)."""

@op("list", images=("a", "b"), http=Http(_G, "/diff", query=("a", "b"), const={"patch": True}, result="patch"))
def patch(a: str, b: str) -> str:
    """A unified diff from image a to image b."""

# ---- builds (issue 15): image config and recipes ----------------------------------------------------
@op("list", images=("ref",), http=Http(_G, "/images/{ref:path}/config", handler="image_config"), custom_remote=True)
def image_config(ref: str):
    """An image's config (ImageConfig: env, cwd, user, entrypoint, cmd, expose, labels); empty if it has none."""

@op("import", images=("ref",), audit="configure", http=Http(_P, "/images/{ref:path}/configure", status=201, handler="configure"), custom_remote=True)
def configure(ref: str, config, *, tag: str | None = None) -> str:     # makes an image, runs nothing
    """A new image: `ref` with this ImageConfig (its runs' default env, cwd and user); returns its ID."""

@op("run", audit="build", local="a Recipe's context is a directory of this machine: over HTTP the remote client "
    "sends it as a build_context")
def build(recipe, *, tag: str | None = None, no_cache: bool = False, no_cache_filter=(), network=None, progress=None):
    """Build a Recipe step by step, cached on the image DAG; a BuildResult (no_cache_filter: stage names, step numbers).
    progress: called with a dict per step event (step, total, text, status, output)"""

@op("run", audit="build", http=Http(_P, "/builds", name="build", handler="build"), custom_remote=True)
def build_context(context: str | None, *, dockerfile: str = "Dockerfile", text: str | None = None,
                  tag: str | None = None, build_args: dict | None = None, target: str | None = None, network=None,
                  no_cache: bool = False, no_cache_filter=(), progress=None):
    """Build a Dockerfile (`text`, or the file `dockerfile` inside the context) with a build context; a BuildResult.
    context: a directory or a tar of one (over HTTP: the client's, sent as a tar; unpacked safely, then removed)"""

# ---- runs -----------------------------------------------------------------------------------------
@op("run", images=("ref",), audit="run", http=Http(_P, "/runs", status=201, handler="run", body=("ref", "command", "stdin", "uid", "gid", "disposable", "retries") + RunOptions.names(), const={"wait": True}, rename={"ref": "image"}, model="RunIn", types={**Http.RUN_TYPES, "disposable": "bool"}, defaults=Http.RUN_DEFAULTS, bounds={"retries": {"ge": 0, "le": D.RUN_RETRIES_MAX}}, describe={**Http.RUN_DESCRIBE, "retries": "on a cluster: run it again on another node this many times at most if its node is lost before it committed"}), custom_remote=True, options=RunOptions.parameters())
def run(ref: str, command, *, stdin: bytes | str | None = None, uid: int | None = None, gid: int | None = None,
        disposable: bool | str = False, on_output=None, cancel=None, retries: int = 0):
    """Run a command on an image; its writes become a new image (returned in the record).
    on_output: called with (stream, bytes) as output arrives
    cancel: a threading.Event; set, the command is killed
    retries: on a cluster, run it again on another node this many times at most if its node is lost before it committed anything (0: fail with NodeLost)"""

@op("run", images=("ref",), audit="fork",
    http=Http(_P, "/fork", body=("ref", "commands", "parallel", "uid", "gid", "disposable", "retries") + RunOptions.names(), rename={"ref": "image"}, data=False, handler="fork", model="ForkIn", types={**Http.RUN_TYPES, "disposable": "bool", "commands": "list[str | list[str]]"}, defaults=Http.RUN_DEFAULTS, bounds={"retries": {"ge": 0, "le": D.RUN_RETRIES_MAX}}, describe={**Http.RUN_DESCRIBE, "ref": "an image ID, prefix, tag, or branch:NAME (resolved once; no run moves a branch)", "commands": "one run each, all from the same image", "retries": "on a cluster: run it again on another node this many times at most if its node is lost before it committed"}),
    custom_remote=True, kwargs_of="run")
def fork(ref: str, commands: list, *, parallel: int | None = None, **options) -> list:
    """Run each command on the same image concurrently, one branch each; the records in order
    (the options are run's; a branch ref is resolved once and no run moves it).
    commands: the commands (each a shell string or an argv list), all from the same image
    parallel: at most this many running at once (default: all)"""

@op("list", http=Http(_G, "/operations/{op}", name="get_operation", handler="get_operation"))
def operation(op: str) -> dict:
    """An operation's record (run, import, merge)."""

# ---- live sandboxes and warm pools: table/sandboxes.py (here, so the rows keep their order) ------
from . import sandboxes  # noqa: E402,F401

# ---- lineage ----------------------------------------------------------------------------------------
@op("list", images=("image",), http=Http(_G, "/images/{image:path}/parents", names={"image": "ref"}))
def parents(image: str) -> list[dict]:
    """The images an image was made from, with the operations that made it."""

@op("list", images=("image",), http=Http(_G, "/images/{image:path}/children", names={"image": "ref"}))
def children(image: str) -> list[dict]:
    """The images made from an image, with their operations."""

@op("list", images=("image",), http=Http(_G, "/images/{image:path}/log", query=("limit",), names={"image": "ref"}, bounds={"limit": {"ge": 1, "le": 100_000}}))
def log(image: str, limit: int = D.LOG_LIMIT) -> list[dict]:
    """An image's history, newest first: each step's operation and command."""

@op("list", images=("image",), http=Http(_G, "/images/{image:path}/ancestors", names={"image": "ref"}))
def ancestors(image: str) -> dict[str, int]:
    """Every ancestor with its distance."""

@op("list", images=("image",), http=Http(_G, "/images/{image:path}/descendants", names={"image": "ref"}))
def descendants(image: str) -> dict[str, int]:
    """Every descendant with its distance."""

@op("list", images=("image",), http=Http(_G, "/images/{image:path}/produced-by", names={"image": "ref"}))
def produced_by(image: str) -> list[dict]:
    """The operations whose result is this image."""

@op("list", images=("root",), http=Http(_G, "/images/{root:path}/lineage", query=("max_nodes",), result="tree", names={"root": "ref"}, name="image_lineage", handler="image_lineage"))
def lineage_tree(root: str, *, max_nodes: int = D.LINEAGE_MAX_NODES) -> dict:
    """The tree of images grown from `root`, each edge labelled by its command."""

@op("list", images=("a", "b"), http=Http(_G, "/lineage/common", query=("a", "b"), result="image", name="common"))
def common_ancestor(a: str, b: str) -> str | None:
    """The nearest image both descend from (None: none)."""

@op("list", images=("a", "b"), http=Http(_G, "/lineage/path", query=("a", "b")))
def lineage_path(a: str, b: str) -> list[str]:
    """The images on the way from a to b through the lineage."""

# ---- branching ------------------------------------------------------------------------------------
@op("run", images=("base", "ours", "theirs"), audit="merge",
    http=Http(_P, "/merge", body=("base", "ours", "theirs", "strategy", "ignore", "on_conflict"), model="MergeIn", types={"on_conflict": 'Literal["raise", "return"]'}, defaults={"base": None}, describe={"ignore": "globs that never conflict (ours taken); null: __pycache__/, *.pyc, .pytest_cache/; [] for none", "on_conflict": "conflicts without a strategy: 409 merge_conflict (raise) or 200 with image null (return)"}))
def merge(base: str | None, ours: str, theirs: str, *, strategy: str | None = None, ignore: list[str] | None = None,
          on_conflict: str = "raise") -> dict:
    """Three-way merge of what two images changed since their common ancestor, as a new image."""

@op("list", images=("base", "ours", "theirs"), http=Http(_G, "/merge/preview", query=("base", "ours", "theirs"), defaults={"base": None}))
def merge_preview(base: str | None, ours: str, theirs: str) -> dict:
    """What merge would make, making nothing: clean or not, its conflicts, each conflicted text file with markers."""

@op("tag", images=("image",), audit="branch create", http=Http(_P, "/branches", body=("name", "image", "force"), name="create_branch", status=201, model="BranchIn", echo={"name": "branch", "image": "image"}))
def branch_create(name: str, image: str, *, force: bool = False) -> None:
    """A branch: a name whose head moves with each run on branch:NAME."""

@op("tag", audit="branch delete", http=Http(_X, "/branches/{name:path}", result="image", name="delete_branch", echo={"name": "branch"}))
def branch_delete(name: str) -> str:
    """Remove a branch; returns its head."""

@op("list", http=Http(_G, "/branches"))
def branches() -> dict[str, str]:
    """Branch -> head image."""

@op("list", http=Http(_G, "/branches/{name:path}", result="image", echo={"name": "branch"}))
def branch_head(name: str) -> str:
    """A branch's head image."""

@op("list", http=Http(_G, "/branches/{name:path}/log"))
def branch_log(name: str) -> list[dict]:
    """Where a branch's head has been, newest first."""

@op("tag", audit="rollback", http=Http(_P, "/branches/{name:path}/rollback", body=("to", "steps"), result="image", model="RollbackIn", echo={"name": "branch"}))
def rollback(name: str, *, to: str | None = None, steps: int | None = None) -> str:
    """Move a branch's head back (to an image, or `steps` back along its log)."""

@op(None, admin=True, local=_LOCAL_HOST)
def bundle_create(path: str, images: list[str], *, with_ancestry: bool = False) -> dict:
    """Write images (and their ancestry) to a bundle file."""

@op("import", audit="bundle import", local=_LOCAL_HOST)
def bundle_import(path: str) -> dict:
    """Read a bundle file's images into the store."""

# ---- the server and its store ------------------------------------------------------------------------
@op(None, caller=True, http=Http(_G, "/whoami"))
def whoami() -> dict:
    """Who the caller is: tenant, scopes, the store."""

@op(None, http=Http(_G, "/doctor"))
def doctor() -> list[dict]:
    """What works on this machine: each tier, cgroups, CRIU, ..."""

@op(None, admin=True, http=Http(_G, "/cluster", doc="Where runs go: this server alone (mode local) or a Ray cluster's nodes, their load and sandboxes."))
def cluster_status() -> dict:
    """Where runs go: mode (local or cluster), each node with its CPUs, runs in flight and live sandboxes."""

@op(None, caller=True, http=Http(_G, "/audit", query=("tenant", "limit"), bounds={"limit": {"ge": 1, "le": 10000}}, doc="Who ran what on which image, newest first: a tenant's token sees its own records."))
def audit(*, tenant: str | None = None, limit: int = D.AUDIT_LIMIT) -> list[dict]:
    """The audit trail, newest first (a tenant: its own)."""

@op(None, admin=True, http=Http(_P, "/admin/fsck", query=("verify_content",)))
def fsck(verify_content: bool = True) -> dict:
    """Check the store; verify_content re-hashes every blob."""

@op(None, admin=True, audit="gc", http=Http(_P, "/admin/gc", query=("retention", "grace")))
def gc(retention: float = D.GC_RETENTION, grace: float = D.GC_GRACE) -> dict:
    """Remove unreachable images and data older than `retention` (never younger than `grace`)."""

@op("run", caller=True, audit="secret set", http=Http(_U, "/secrets/{name}", body=("value", "hosts", "tenants", "tenant"), model="SecretIn", types={"hosts": "list[str] | str"}, doc='Store a secret runs name (secrets=["NAME"]): its name, hosts and times come back, never its value.', model_doc="PUT /secrets/{name}: a stored secret (the value is never in an answer, a log or the audit)."))
def secret_set(name: str, value: str, hosts: list[str], *, tenants: list[str] | None = None, tenant: str | None = None) -> dict:
    """Store a secret that runs name (secrets=["NAME"]), kept outside the database; its value is never shown again."""
@op("list", caller=True, http=Http(_G, "/secrets", query=("tenant",), doc="The stored secrets the caller may use (its own, and the operator's shared with it)."))
def secret_list(*, tenant: str | None = None) -> list[dict]:
    """The stored secrets the caller may use: name, hosts, owner, times (never a value)."""
@op("run", caller=True, audit="secret remove", http=Http(_X, "/secrets/{name}", query=("tenant",)))
def secret_remove(name: str, *, tenant: str | None = None) -> None:
    """Forget a stored secret (runs and sandboxes already started keep theirs)."""

# ---- operations: runs submitted now, awaited later (engine.operations.<name>) ---------------------------
@op("run", images=("ref",), audit="run", group="operations", http=Http(_P, "/runs"), custom_remote=True, kwargs_of="run")
def submit_run(ref: str, command, **options) -> str:
    """Start a run and return its operation ID at once (the options are run's)."""

@op("list", group="operations", http=Http(_G, "/operations/{op}"))
def get(op: str) -> dict:
    """An operation's record and status."""

@op("list", group="operations", http=Http(_P, "/operations/{op}/wait", query=("timeout",), name="wait_operation", handler="wait_operation", defaults={"timeout": D.OPERATION_WAIT}, bounds={"timeout": {"ge": 0, "le": D.WAIT_MAX}}), custom_remote=True)
def wait(ops: list[str], timeout: float | None = None) -> list[dict]:
    """Wait for operations to end; their records, in order."""

@op("list", group="operations", http=Http(_G, "/operations/{op}"), custom_remote=True)
def result(op: str):
    """A finished run's record with its whole output (None while it runs)."""

@op("cancel", audit="cancel", group="operations", http=Http(_P, "/operations/{op}/cancel", name="cancel_operation"))
def cancel(op: str) -> dict:
    """Stop a submitted operation."""

@op("list", group="operations", http=Http(_G, "/operations", query=("status", "limit", "kind"), name="list_operations", bounds={"limit": {"ge": 1, "le": 1000}}))
def list(*, status: str | None = None, limit: int = D.OPERATIONS_LIMIT, kind: str = "run") -> list[dict]:   # noqa: A001
    """Operations, newest first (status: queued, running, done, failed, cancelled)."""

ENGINE_OPS = {k: v for k, v in OPS.items() if v.group == "engine"}
OPERATIONS_OPS = {v.name: v for v in OPS.values() if v.group == "operations"}
del list                                  # the row above; `list` is the builtin again below this line
