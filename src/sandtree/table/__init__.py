"""The operation table: every engine operation declared once (Firecracker's single action vocabulary). Each row is
a declaration: a signature (a function whose body is only its docstring), the token scope a tenant needs, which
arguments name images (a tenant may name only images it sees), the audit action, and the HTTP binding. From the
rows come the tenant and admin views (tenancy/), the remote client (client/remote.py), MCP parameter
descriptions (vocabulary.py), and the conformance test that Engine, the tenant view and the remote client expose
the same operations with the same signatures (tests/conformance/test_conformance.py). The engine implements each row as a
method of the same name and signature; nothing here runs one. What a row is: rows.py. Imports only defaults.py
and rows.py (the remote client loads it)."""

from __future__ import annotations

from .. import defaults as D
from . import rows
from .options import RunOptions
from .mcp import REQUIRED, RUN_JSON, Mcp, Param, Result      # MCP's tools, declared beside the rows (table/mcp.py)
from .cli import Cli
from .sdk import Sdk, keyword

# What a row is (rows.py), named here too: the table's readers know one module.
Http, Off, Op, OPS, SURFACES, op, via = rows.Http, rows.Off, rows.Op, rows.OPS, rows.SURFACES, rows.op, rows.via

__all__ = ["Http", "Off", "Op", "OPS", "SURFACES", "ENGINE_OPS", "OPERATIONS_OPS", "RunOptions", "op", "via",
           "Cli", "Mcp", "Param", "REQUIRED", "RUN_JSON", "Result", "Sdk", "keyword"]

_G, _P, _U, _X, _LOCAL_HOST = "GET", "POST", "PUT", "DELETE", "it reads or writes paths of the server's own machine"
# MCP's run tool: run and submit_run (wait=false) alike; a tool call waits D.MCP_TIMEOUT, keeps its result unless told
_MCP_RUN = Mcp(name="run", handler="run", rename={"ref": "image"}, defaults={"timeout": D.MCP_TIMEOUT},
               types=RUN_JSON, extra=("shell", "directory_state_id", "wait", "truncate_output_at"),
               core=("command", "image", "shell", "env", "timeout", "disposable", "network"))

# ---- names, images, refs -------------------------------------------------------------------------
@op("list", http=Http(_G, "/resolve", query=("ref",), result="image"))
@via("mcp", Mcp(name="get_image", handler="get_image"))
def resolve(ref: str) -> str:
    """The full image ID a reference names."""

@via("cli", Cli("image list", show="images"))
@op("list", http=Http(_G, "/images", name="list_images"))
@via("mcp", Mcp(name="list_images", handler="list_images", extra=("tag_prefix", "limit"), core=True))
def images() -> list[dict]:
    """Every image (a tenant: the ones it may see)."""

@via("cli", Cli(show="tagged"))
@op("tag", images=("image",), audit="tag", http=Http(_U, "/tags/{name:path}", body=("image",), name="set_tag", model="TagIn", echo={"name": "tag", "image": "image"}))
@via("mcp", Mcp(name="set_tag", rename={"name": "tag"}, resolve=("image",), result=Result(echo=("image", "tag")),
                doc="Point a tag at an image (moves it if it exists). Convention: {scope}/{purpose}/{base}."))
def tag(image: str, name: str) -> None:
    """Point tag `name` at an image (moves an existing tag)."""

@via("cli", Cli(handler="exploration.cmd_annotate"))
@via("sdk", Sdk("metadata as keywords: img.annotate(0.7, task=\"t1\")", spread="meta"))
@op("tag", images=("image",), audit="annotate", http=Http(_P, "/images/{image:path}/annotations", body=("score", "meta"), model="AnnotateIn"))
@via("mcp", Mcp(resolve=("image",), result=Result(echo=("image",)), doc="""Attach a score and metadata (key -> string/number/boolean; null removes a key) to an image, like git
        notes: its ID stays. Returns your annotations of it (each tenant has its own). Tree search scores its
        nodes this way.
        score: a finite number (e.g. a reward or the fraction of tests passing); omitted: unchanged
        meta: key -> string, number, boolean or null (removes the key); keys 1-64 of A-Z a-z 0-9 _ . -"""))
def annotate(image: str, score: float | None = None, meta: dict | None = None) -> dict:
    """Merge a score and metadata (key -> JSON scalar; null removes a key) into your annotations of an image; returns them."""

@via("cli", Cli(show="untagged"))
@op("tag", audit="untag", http=Http(_X, "/tags/{name:path}", result="image", name="delete_tag", echo={"name": "tag"}))
@via("mcp", Off("an agent moves tags with set_tag; removing one is the CLI's and REST's"))
def untag(name: str) -> str:
    """Remove a tag; returns the image it named."""

@op("list", images=("image",), http=Http(_G, "/tags", query=("image",)))
@via("mcp", Off("list_images and get_image show an image's tags"))
def tags(image: str | None = None) -> dict[str, str]:
    """Tag -> image (only an image's own tags when `image` is given)."""

@via("cli", Cli("image info"))
@op("list", images=("image",), http=Http(_G, "/images/{image:path}", name="get_image", names={"image": "ref"}))
@via("mcp", Mcp(name="get_image", handler="get_image", resolve=("image",)))
def image_info(image: str) -> dict:
    """An image's row: id, parents, size, creation time, tags, annotations."""

@via("cli", Cli("image rm", args=("image+",), dest={"image": "images"}, show="removed"))
@op(None, admin=True, images=("image",), audit="remove image", http=Http(_X, "/images/{image:path}", query=("force",), names={"image": "ref"}, echo={"image": "removed"}))
@via("mcp", Off("admin: removing images is the operator's (CLI, REST)"))
def remove_image(image: str, *, force: bool = False) -> None:
    """Remove an image (its data goes at the next gc); refused while tags or children name it unless force."""

@via("cli", Cli("image share", show="share"))
@op("tag", images=("image",), audit="share", caller=True, http=Http(_P, "/images/{image:path}/share", const={"public": True}, names={"image": "ref"}, model="ShareIn", doc="Make an image (one the caller owns) visible to every tenant by its ID, or stop that."))
@via("mcp", Off("making an image every tenant's is its owner's decision, made outside the agent (CLI, REST)"))
def share(image: str) -> dict:
    """Make an image visible to every tenant."""

@via("cli", Cli("image unshare", show="share"))
@op("tag", images=("image",), audit="unshare", caller=True, http=Http(_P, "/images/{image:path}/share", const={"public": False}, names={"image": "ref"}))
@via("mcp", Off("making an image every tenant's is its owner's decision, made outside the agent (CLI, REST)"))
def unshare(image: str) -> dict:
    """Make a shared image private to its owners again."""

# ---- import ---------------------------------------------------------------------------------------
@via("cli", Cli("image import", show="image_made"))
@op("import", audit="import", http=Http(_P, "/images/import", query=("tag",), drop=("progress",), name="import_tar", status=201, handler="import_tar"), custom_remote=True)
@via("mcp", Mcp(name="import_image", handler="import_image", rename={"path": "source"}))
def import_path(path: str, *, tag: str | None = None, progress=None) -> str:
    """Import a directory, tar, OCI layout or docker-archive; returns the image ID.
    path: a directory or archive file (over HTTP: the client's own, sent as a tar)"""

@via("cli", Cli("image pull", show="image_made"))
@op("import", audit="pull", http=Http(_P, "/images/pull", body=("reference", "tag", "insecure"), result="image", drop=("progress",), status=201, model="PullIn", echo={"tag": "tag"}, describe={"insecure": "plain HTTP to the registry (a test registry on loopback)"}))
@via("mcp", Mcp(name="import_image", handler="import_image", rename={"reference": "source"}))
def pull(reference: str, *, tag: str | None = None, insecure: bool = False, progress=None) -> str:
    """Pull docker://HOST/NAME:TAG from an OCI registry; returns the image ID.
    reference: docker://HOST[:PORT]/NAME[:TAG|@DIGEST]"""

@via("cli", Cli("registry login", handler="images.cmd_registry_login"))
@via("sdk", Off("credentials are the server operator's: `sandtree registry login`, or st.engine.registry_login"))
@op(None, admin=True, audit="registry login",
    http=Http(_P, "/registries/login", body=("registry_url", "username", "secret", "insecure"), result="registry",
              rename={"registry_url": "registry", "secret": "token"}, model="LoginIn", describe={"insecure": "plain HTTP to this registry (a test registry on loopback)"}))
@via("mcp", Mcp(name="registry_auth", handler="registry_auth", rename={"secret": "token"}))
def registry_login(registry_url: str, username: str, secret: str, *, insecure: bool = False) -> str:
    """Store credentials for a registry (the secret is never returned or logged)."""

@via("cli", Cli("registry logout", show="registry_logout"))
@via("sdk", Off("credentials are the server operator's: `sandtree registry logout`, or st.engine.registry_logout"))
@op(None, admin=True, audit="registry logout", http=Http(_X, "/registries/{registry_url}", result="registry"))
@via("mcp", Off("credentials are the operator's (CLI, REST), not an agent's"))
def registry_logout(registry_url: str) -> str:
    """Forget a registry's stored credentials; returns its host (NotFound when none are stored)."""

@via("cli", Cli("registry list", show="registries"))
@via("sdk", Off("credentials are the server operator's: `sandtree registry list`, or st.engine.registry_list"))
@op(None, admin=True, http=Http(_G, "/registries"))
@via("mcp", Off("credentials are the operator's (CLI, REST), not an agent's"))
def registry_list() -> list[dict]:
    """The registries with stored credentials: each one's registry and username (never the secret)."""

@via("cli", Cli("registry host"))
@via("sdk", Off("a parsing helper of the CLI and REST: st.engine.registry_host"))
@op(None, http=Http(_G, "/registries/host", query=("reference",), result="registry"))
@via("mcp", Mcp(name="registry_token_obtain", handler="registry_token_obtain", rename={"reference": "registry_url"}))
def registry_host(reference: str) -> str:
    """The registry a URL or image reference names (docker://ghcr.io/org/x -> ghcr.io)."""

@via("cli", Cli("image push", show="push"))
@op(None, admin=True, images=("image",), audit="push",
    http=Http(_P, "/images/{image:path}/push", body=("reference", "insecure"), drop=("progress",), names={"image": "ref"}, model="PushIn", describe={"insecure": "plain HTTP to the registry (a test registry on loopback)", "reference": "docker://HOST[:PORT]/NAME[:TAG]"}))
@via("mcp", Mcp(name="push_image", params=("image", "reference"), resolve=("image",), doc="""Push an image to an OCI registry as docker://HOST[:PORT]/NAME[:TAG] so Docker, Podman or
        Kubernetes can run it (admin only; credentials from registry_auth). An unchanged image
        uploads nothing. Returns the manifest digest and how many blobs were uploaded."""))
def push(image: str, reference: str, *, insecure: bool = False, progress=None) -> dict:
    """Push an image to docker://HOST[:PORT]/NAME[:TAG] (admin: with the server's stored credentials)."""
@via("cli", Cli("image export", handler="images.cmd_image_export"))
@op("list", images=("image",), http=Http(_G, "/images/{image:path}/oci", query=("name",), names={"image": "ref"}, handler="export_oci"), custom_remote=True)
@via("mcp", Off("it writes a tar to a file object, no JSON answer (push_image sends an image to a registry)"))
def export_oci(image: str, fileobj, *, name: str | None = None) -> dict:
    """Write an image as an OCI image layout (a tar) to a file object. name: the index's ref name."""

@via("cli", Cli("image bootstrap", handler="images.cmd_image_bootstrap"))
@via("sdk", Sdk("st.bootstrap() builds the usual base", defaults={"spec": D.BOOTSTRAP_SPEC}))
@op(None, admin=True, local="it runs debootstrap on the server's machine: use `sandtree image bootstrap` there")
@via("mcp", Mcp(name="import_image", handler="import_image", rename={"spec": "source"}))
def bootstrap(spec: str, *, include: list[str] = (), tag: str | None = None, log=None, mirror: str | None = None) -> str:
    """Build a Debian base image with debootstrap (spec: SUITE, e.g. bookworm)."""

# ---- uploads and file sets --------------------------------------------------------------------------
@via("cli", Off("uploads and file sets are how a remote caller brings its files: here `run --file LOCAL:PATH` reads them"))
@via("sdk", Off("the SDK sends files with the run: files={\"/dest\": bytes | Path} (st.engine.upload for a blob)"))
@op("run", http=Http(_P, "/files", content="data", result="sha256", status=201, handler="upload"))
@via("mcp", Mcp(handler="upload", extra=("content", "content_base64")))
def upload(data: bytes) -> str:
    """Store bytes for later runs; returns their sha256."""

@via("cli", Off("uploads and file sets are how a remote caller brings its files: here `run --file LOCAL:PATH` reads them"))
@via("sdk", Off("the SDK sends files with the run: files={\"/dest\": Path}"))
@op("run", local=_LOCAL_HOST)
@via("mcp", Mcp(name="upload", handler="upload", types={"path": "str | None"}, defaults={"path": None}))
def upload_file(path: str, digest: str | None = None) -> str:
    """Store a file of this machine (streamed); returns its sha256."""

@via("cli", Off("uploads and file sets are how a remote caller brings its files: here `run --file LOCAL:PATH` reads them"))
@via("sdk", Off("uploads are the remote client's plumbing under files= (st.engine.upload_info)"))
@op("list", http=Http(_G, "/files/{digest}/info", names={"digest": "sha256"}, doc="An upload's size and time (the caller's own upload, or 404)."))
@via("mcp", Off("import_image(upload:SHA256) reads an upload's size; upload answered it"))
def upload_info(digest: str) -> dict:
    """An upload's size and time."""

@via("cli", Off("uploads and file sets are how a remote caller brings its files: here `run --file LOCAL:PATH` reads them"))
@via("sdk", Off("uploads are the remote client's plumbing under files= (st.engine.uploads)"))
@op("list", caller=True, http=Http(_G, "/files", query=("limit", "offset"), doc="Uploaded files (sha256, size, created), newest first."))
@via("mcp", Off("an agent keeps the sha256 each upload answers"))
def uploads(*, limit: int = 100, offset: int = 0) -> list[dict]:
    """Uploaded files (sha256, size, created), newest first (a tenant: its own)."""

@via("cli", Off("uploads and file sets are how a remote caller brings its files: here `run --file LOCAL:PATH` reads them"))
@via("sdk", Off("the server's own lookup of a digest prefix (CLI and Contree)"))
@op("list", local="the server answers it per request")
@via("mcp", Off("an agent keeps the whole sha256 each upload answers"))
def find_upload(prefix: str) -> str:
    """The one upload whose digest starts with `prefix`."""

@via("cli", Off("uploads and file sets are how a remote caller brings its files: here `run --file LOCAL:PATH` reads them"))
@via("sdk", Off("uploads are the remote client's plumbing under files= (st.engine.download)"))
@op("list", http=Http(_G, "/files/{digest}", raw=True, names={"digest": "sha256"}, handler="download"))
@via("mcp", Off("an upload's bytes are the agent's own; import_image and build read them back"))
def download(digest: str) -> bytes:
    """An upload's bytes."""

@via("cli", Off("uploads and file sets are how a remote caller brings its files: here `run --file LOCAL:PATH` reads them"))
@via("sdk", Off("the SDK sends files with the run: files=; a stored set is REST's and MCP's"))
@op("run", http=Http(_P, "/file-sets", whole_body="files", result="id", name="file_set", status=201, doc='A reusable set of uploaded files ({"path", "sha256", "mode"}); its ID is its content hash.'))
@via("mcp", Mcp(name="rsync", handler="rsync", extra=("source", "destination", "exclude")))
def file_set_create(files: list[dict]) -> str:
    """Store a set of files ({path, content | blob, mode}) to put into runs; returns its ID."""

@via("cli", Off("uploads and file sets are how a remote caller brings its files: here `run --file LOCAL:PATH` reads them"))
@via("sdk", Off("the server's own lookup of a stored file set"))
@op("list", local="the server answers it per request")
@via("mcp", Off("a file set is the agent's own rsync; build(directory_state_id=) reads it back"))
def file_set(set_id: str) -> list[dict]:
    """A stored file set's files."""

# ---- inspection ----------------------------------------------------------------------------------
@via("cli", Cli(args=("image", "path?"), show="entries"))
@op("list", images=("image",), http=Http(_G, "/images/{image:path}/ls", query=("path",), data=True, names={"image": "ref"}))
@via("mcp", Mcp(name="list_files", resolve=("image",), result=Result(keep=("name", "type", "mode", "size", "target")),
                doc="A directory of an image (no sandbox is started).", core=True))
def ls(image: str, path: str = "/") -> list[dict]:
    """The entries of a directory of an image."""

@via("cli", Cli(show="fields"))
@op("list", images=("image",), http=Http(_G, "/images/{image:path}/stat", query=("path",), data=True, names={"image": "ref"}))
@via("mcp", Mcp(name="read_file", handler="read_file"))
def stat(image: str, path: str) -> dict:
    """One path's metadata."""

@via("cli", Cli("cat", show="bytes"))
@via("sdk", Sdk("offset and limit read as options of img.read(path), as they always have", keyword=("offset", "limit")))
@op("list", images=("image",), http=Http(_G, "/images/{image:path}/read", query=("path", "offset", "limit"), raw=True, names={"image": "ref"}, handler="read"))
@via("mcp", (Mcp(name="read_file", handler="read_file", resolve=("image",), defaults={"limit": D.MCP_READ_LIMIT}, core=True),
                 Mcp(name="download", handler="download", resolve=("image",), extra=("destination",))))
def read(image: str, path: str, offset: int = 0, limit: int | None = None) -> bytes:
    """A file's bytes (from `offset`, at most `limit`)."""

@via("cli", Cli(handler="inspection.cmd_grep"))
@via("sdk", Sdk("the row takes its options as **kw: these are they", kw=(
    keyword("glob", None, "str | None"), keyword("max_matches", D.GREP_MAX_MATCHES, "int"),
    keyword("ignore_case", False, "bool"), keyword("before", 0, "int"), keyword("after", 0, "int"))))
@op("list", images=("image",), http=Http(_G, "/images/{image:path}/grep", query=("pattern", "path"), names={"image": "ref"}, handler="grep"))
@via("mcp", Mcp(resolve=("image",), extra=(Param("glob", "str | None", None), Param("max_matches", "int", D.MCP_GREP_MATCHES),
                                 Param("ignore_case", "bool", False)),
                doc="Search file contents of an image with a regular expression (no sandbox is started).",
                core=("image", "pattern", "path", "ignore_case")))
def grep(image: str, pattern: str, path: str = "/", **kw) -> list[dict]:
    """Lines matching an RE2 pattern under a path.
    pattern: an RE2 regular expression (no backtracking: linear time)"""

@via("cli", Cli("image export", handler="images.cmd_image_export"))
@op("list", images=("image",), http=Http(_G, "/images/{image:path}/export", query=("path",), names={"image": "ref"}, name="export", handler="export"), custom_remote=True)
@via("mcp", Off("it writes a tar to a file object, no JSON answer: read_file and download take files out"))
def export_tar(image: str, fileobj, path: str = "/") -> None:
    """Write an image (or one directory of it) as a tar to a file object."""

@via("cli", Cli(handler="branching.cmd_diff"))
@op("list", images=("a", "b"), http=Http(_G, "/diff", query=("a", "b"), result="changes", data=True, echo={"a": "a", "b": "b"}))
@via("mcp", Mcp(handler="diff", resolve=("a", "b"), extra=("patch",), core=True))
def diff(a: str, b: str) -> list:
    """What changed from image a to image b (added, deleted, modified, ...)."""

@via("cli", Cli("diff", handler="branching.cmd_diff"))
@op("list", images=("a", "b"), http=Http(_G, "/diff", query=("a", "b"), const={"patch": True}, result="patch"))
@via("mcp", Mcp(name="diff", handler="diff", resolve=("a", "b")))
def patch(a: str, b: str) -> str:
    """A unified diff from image a to image b."""

# ---- builds: image config and recipes ----------------------------------------------------
@via("cli", Cli("image config"))
@op("list", images=("ref",), http=Http(_G, "/images/{ref:path}/config", handler="image_config"), custom_remote=True)
@via("mcp", Mcp(handler="image_config", rename={"ref": "image"}, resolve=("ref",)))
def image_config(ref: str):
    """An image's config (ImageConfig: env, cwd, user, entrypoint, cmd, expose, labels); empty if it has none."""

@via("cli", Off("an image's config comes from a Dockerfile's ENV, WORKDIR, USER, ...: `sandtree build`"))
@op("import", images=("ref",), audit="configure", http=Http(_P, "/images/{ref:path}/configure", status=201, handler="configure"), custom_remote=True)
@via("mcp", Off("an agent gives an image its config with a Dockerfile (the build tool)"))
def configure(ref: str, config, *, tag: str | None = None) -> str:     # makes an image, runs nothing
    """A new image: `ref` with this ImageConfig (its runs' default env, cwd and user); returns its ID."""

@via("cli", Cli(handler="build.cmd_build"))
@op("run", audit="build", local="a Recipe's context is a directory of this machine: over HTTP the remote client "
    "sends it as a build_context")
@via("mcp", Off("a Recipe is an object of this process: the build tool takes a Dockerfile"))
def build(recipe, *, tag: str | None = None, no_cache: bool = False, no_cache_filter=(), network=None, progress=None):
    """Build a Recipe step by step, cached on the image DAG; a BuildResult (no_cache_filter: stage names, step numbers).
    progress: called with a dict per step event (step, total, text, status, output)"""

@via("cli", Cli("build", handler="build.cmd_build"))
@via("sdk", Sdk("st.build_context() builds the current directory, as `docker build .`", defaults={"context": "."}))
@op("run", audit="build", http=Http(_P, "/builds", name="build", handler="build"), custom_remote=True)
@via("mcp", Mcp(name="build", handler="build", rename={"text": "dockerfile"}, defaults={"text": REQUIRED},
                extra=("files", "directory_state_id")))
def build_context(context: str | None, *, dockerfile: str = "Dockerfile", text: str | None = None,
                  tag: str | None = None, build_args: dict | None = None, target: str | None = None, network=None,
                  no_cache: bool = False, no_cache_filter=(), progress=None):
    """Build a Dockerfile (`text`, or the file `dockerfile` inside the context) with a build context; a BuildResult.
    context: a directory or a tar of one (over HTTP: the client's, sent as a tar; unpacked safely, then removed)"""

# ---- runs -----------------------------------------------------------------------------------------
@via("cli", Cli(handler="runs.cmd_run"))
@op("run", images=("ref",), audit="run", http=Http(_P, "/runs", status=201, handler="run", body=("ref", "command", "stdin", "uid", "gid", "disposable", "retries") + RunOptions.names(), const={"wait": True}, rename={"ref": "image"}, model="RunIn", types={**Http.RUN_TYPES, "disposable": "bool"}, defaults=Http.RUN_DEFAULTS, bounds={"retries": {"ge": 0, "le": D.RUN_RETRIES_MAX}}, describe={**Http.RUN_DESCRIBE, "retries": "on a cluster: run it again on another node this many times at most if its node is lost before it committed"}), custom_remote=True, options=RunOptions.parameters())
@via("mcp", _MCP_RUN)
def run(ref: str, command, *, stdin: bytes | str | None = None, uid: int | None = None, gid: int | None = None,
        disposable: bool | str = False, on_output=None, cancel=None, retries: int = 0):
    """Run a command on an image; its writes become a new image (returned in the record).
    on_output: called with (stream, bytes) as output arrives
    cancel: a threading.Event; set, the command is killed
    retries: on a cluster, run it again on another node this many times at most if its node is lost before it committed anything (0: fail with NodeLost)"""

@via("cli", Cli(handler="runs.cmd_fork", defaults={"parallel": D.CLI_FORK_PARALLEL}))
@via("sdk", Sdk("a fork from Python runs a few at once, not every command (a long list would start every sandbox)",
                defaults={"parallel": D.FORK_PARALLEL}))
@op("run", images=("ref",), audit="fork",
    http=Http(_P, "/fork", body=("ref", "commands", "parallel", "uid", "gid", "disposable", "retries") + RunOptions.names(), rename={"ref": "image"}, data=False, handler="fork", model="ForkIn", types={**Http.RUN_TYPES, "disposable": "bool", "commands": "list[str | list[str]]"}, defaults=Http.RUN_DEFAULTS, bounds={"retries": {"ge": 0, "le": D.RUN_RETRIES_MAX}}, describe={**Http.RUN_DESCRIBE, "ref": "an image ID, prefix, tag, or branch:NAME (resolved once; no run moves a branch)", "commands": "one run each, all from the same image", "retries": "on a cluster: run it again on another node this many times at most if its node is lost before it committed"}),
    custom_remote=True, kwargs_of="run")
@via("mcp", Mcp(handler="fork", rename={"ref": "image"}, extra=("truncate_output_at",),
                defaults={"parallel": D.MCP_FORK_PARALLEL, "timeout": D.MCP_TIMEOUT},
                core=("image", "commands", "timeout", "disposable")))
def fork(ref: str, commands: list, *, parallel: int | None = None, **options) -> list:
    """Run each command on the same image concurrently, one branch each; the records in order
    (the options are run's; a branch ref is resolved once and no run moves it).
    commands: the commands (each a shell string or an argv list), all from the same image
    parallel: at most this many running at once (default: all)"""

@via("cli", Cli("op", dest={"op": "id"}, show="indented"))
@op("list", http=Http(_G, "/operations/{op}", name="get_operation", handler="get_operation"))
@via("mcp", Off("get_operation shows a run's operation"))
def operation(op: str) -> dict:
    """An operation's record (run, import, merge)."""

# ---- live sandboxes and warm pools: table/sandboxes.py (here, so the rows keep their order) ------
from . import sandboxes  # noqa: E402,F401
# ---- volumes: table/volumes.py ------------------------------------------------------------------------
from . import volumes  # noqa: E402,F401

# ---- lineage ----------------------------------------------------------------------------------------
@op("list", images=("image",), http=Http(_G, "/images/{image:path}/parents", names={"image": "ref"}))
@via("mcp", Off("lineage and get_image show an image's history"))
def parents(image: str) -> list[dict]:
    """The images an image was made from, with the operations that made it."""

@op("list", images=("image",), http=Http(_G, "/images/{image:path}/children", names={"image": "ref"}))
@via("mcp", Off("lineage and get_image show an image's history"))
def children(image: str) -> list[dict]:
    """The images made from an image, with their operations."""

@via("cli", Cli(show="log"))
@op("list", images=("image",), http=Http(_G, "/images/{image:path}/log", query=("limit",), names={"image": "ref"}, bounds={"limit": {"ge": 1, "le": 100_000}}))
@via("mcp", Mcp(name="lineage", handler="lineage"))
def log(image: str, limit: int = D.LOG_LIMIT) -> list[dict]:
    """An image's history, newest first: each step's operation and command."""

@via("cli", Cli("lineage", handler="branching.cmd_lineage"))
@op("list", images=("image",), http=Http(_G, "/images/{image:path}/ancestors", names={"image": "ref"}))
@via("mcp", Off("lineage and get_image show an image's history"))
def ancestors(image: str) -> dict[str, int]:
    """Every ancestor with its distance."""

@via("cli", Cli("lineage", handler="branching.cmd_lineage"))
@op("list", images=("image",), http=Http(_G, "/images/{image:path}/descendants", names={"image": "ref"}))
@via("mcp", Off("lineage and get_image show an image's history"))
def descendants(image: str) -> dict[str, int]:
    """Every descendant with its distance."""

@via("cli", Cli("lineage", handler="branching.cmd_lineage"))
@op("list", images=("image",), http=Http(_G, "/images/{image:path}/produced-by", names={"image": "ref"}))
@via("mcp", Mcp(name="get_image", handler="get_image"))
def produced_by(image: str) -> list[dict]:
    """The operations whose result is this image."""

@via("cli", Cli("tree", handler="branching.cmd_tree"))
@op("list", images=("root",), http=Http(_G, "/images/{root:path}/lineage", query=("max_nodes",), result="tree", names={"root": "ref"}, name="image_lineage", handler="image_lineage"))
@via("mcp", Mcp(name="lineage", handler="lineage", rename={"root": "image"}, resolve=("root",), extra=("format",), core=True))
def lineage_tree(root: str, *, max_nodes: int = D.LINEAGE_MAX_NODES) -> dict:
    """The tree of images grown from `root`, each edge labelled by its command."""

@via("cli", Cli("lineage", handler="branching.cmd_lineage"))
@op("list", images=("a", "b"), http=Http(_G, "/lineage/common", query=("a", "b"), result="image", name="common"))
@via("mcp", Off("lineage and get_image show an image's history"))
def common_ancestor(a: str, b: str) -> str | None:
    """The nearest image both descend from (None: none)."""

@via("cli", Cli("lineage", handler="branching.cmd_lineage"))
@op("list", images=("a", "b"), http=Http(_G, "/lineage/path", query=("a", "b")))
@via("mcp", Off("lineage and get_image show an image's history"))
def lineage_path(a: str, b: str) -> list[str]:
    """The images on the way from a to b through the lineage."""

# ---- branching ------------------------------------------------------------------------------------
@via("cli", Cli(handler="branching.cmd_merge"))
@op("run", images=("base", "ours", "theirs"), audit="merge",
    http=Http(_P, "/merge", body=("base", "ours", "theirs", "strategy", "ignore", "on_conflict"), model="MergeIn", types={"on_conflict": 'Literal["raise", "return"]'}, defaults={"base": None}, describe={"ignore": "globs that never conflict (ours taken); null: __pycache__/, *.pyc, .pytest_cache/; [] for none", "on_conflict": "conflicts without a strategy: 409 merge_conflict (raise) or 200 with image null (return)"}))
@via("mcp", Mcp(handler="merge", defaults={"base": None}, resolve=("base", "ours", "theirs"),
                extra=("return_conflicts",), core=("ours", "theirs", "base", "strategy", "return_conflicts")))
def merge(base: str | None, ours: str, theirs: str, *, strategy: str | None = None, ignore: list[str] | None = None,
          on_conflict: str = "raise") -> dict:
    """Three-way merge of what two images changed since their common ancestor, as a new image."""

@via("cli", Cli("merge", handler="branching.cmd_merge"))
@op("list", images=("base", "ours", "theirs"), http=Http(_G, "/merge/preview", query=("base", "ours", "theirs"), defaults={"base": None}))
@via("mcp", Mcp(defaults={"base": None}, resolve=("base", "ours", "theirs")))
def merge_preview(base: str | None, ours: str, theirs: str) -> dict:
    """What merge would make, making nothing: clean or not, its conflicts, each conflicted text file with markers."""

@via("cli", Cli("branch create", show="branch_moved"))
@via("sdk", Sdk("st.branch(name) opens an existing branch, st.branch(name, image) makes one", defaults={"image": None}))
@op("tag", images=("image",), audit="branch create", http=Http(_P, "/branches", body=("name", "image", "force"), name="create_branch", status=201, model="BranchIn", echo={"name": "branch", "image": "image"}))
@via("mcp", Mcp(resolve=("image",), result=Result(echo=("name", "image"), rename={"name": "branch"}),
                doc='A branch: a name that run(image="branch:NAME") advances; rollback moves it back.'))
def branch_create(name: str, image: str, *, force: bool = False) -> None:
    """A branch: a name whose head moves with each run on branch:NAME."""

@via("cli", Cli("branch delete", show="branch_deleted"))
@op("tag", audit="branch delete", http=Http(_X, "/branches/{name:path}", result="image", name="delete_branch", echo={"name": "branch"}))
@via("mcp", Off("an agent moves a branch back with rollback; deleting one is the CLI's and REST's"))
def branch_delete(name: str) -> str:
    """Remove a branch; returns its head."""

@via("cli", Cli("branch list", show="branches"))
@op("list", http=Http(_G, "/branches"))
@via("mcp", Mcp(name="branch_list", doc="Branches and the images they point at."))
def branches() -> dict[str, str]:
    """Branch -> head image."""

@via("cli", Cli("branch head"))
@op("list", http=Http(_G, "/branches/{name:path}", result="image", echo={"name": "branch"}))
@via("mcp", Off("branch_list shows each branch's head"))
def branch_head(name: str) -> str:
    """A branch's head image."""

@via("cli", Cli("branch log", show="branch_log"))
@op("list", http=Http(_G, "/branches/{name:path}/log"))
@via("mcp", Off("branch_list shows each branch's head"))
def branch_log(name: str) -> list[dict]:
    """Where a branch's head has been, newest first."""

@via("cli", Cli("branch rollback", resolve=("to",), show="branch_moved"))
@op("tag", audit="rollback", http=Http(_P, "/branches/{name:path}/rollback", body=("to", "steps"), result="image", model="RollbackIn", echo={"name": "branch"}))
@via("mcp", Mcp(rename={"name": "branch"}, resolve=("to",), result=Result(key="image", echo=("branch",)),
                doc="Move a branch back: `steps` moves back in its history, or `to` an ancestor image."))
def rollback(name: str, *, to: str | None = None, steps: int | None = None) -> str:
    """Move a branch's head back (to an image, or `steps` back along its log)."""

@via("cli", Cli("bundle create", args=("path", "images+"), dest={"path": "file"}, resolve=("images",), show="bundle"))
@op(None, admin=True, local=_LOCAL_HOST)
@via("mcp", Off("a bundle is a file of the server's machine"))
def bundle_create(path: str, images: list[str], *, with_ancestry: bool = False) -> dict:
    """Write images (and their ancestry) to a bundle file."""

@via("cli", Cli("bundle import", dest={"path": "file"}, show="bundle_images"))
@op("import", audit="bundle import", local=_LOCAL_HOST)
@via("mcp", Off("a bundle is a file of the server's machine"))
def bundle_import(path: str) -> dict:
    """Read a bundle file's images into the store."""

# ---- the server and its store ------------------------------------------------------------------------
@op(None, caller=True, http=Http(_G, "/whoami"))
@via("mcp", Mcp(handler="whoami"))
def whoami() -> dict:
    """Who the caller is: tenant, scopes, the store."""

@via("cli", Cli(show="doctor"))
@op(None, http=Http(_G, "/doctor"))
@via("mcp", Mcp(name="whoami", handler="whoami"))
def doctor() -> list[dict]:
    """What works on this machine: each tier, cgroups, CRIU, ..."""

@via("cli", Cli("cluster status", show="cluster"))
@op(None, admin=True, http=Http(_G, "/cluster", doc="Where runs go: this server alone (mode local) or a Ray cluster's nodes, their load and sandboxes."))
@via("mcp", Mcp(doc="Where runs and sandboxes go: mode local (this server) or cluster (each node: cpus, runs in flight, "
                    "sandboxes)."))
def cluster_status() -> dict:
    """Where runs go: mode (local or cluster), each node with its CPUs, runs in flight and live sandboxes."""

@via("cli", Cli(show="audit", defaults={"limit": D.CLI_AUDIT_LINES}))
@op(None, caller=True, http=Http(_G, "/audit", query=("tenant", "limit"), bounds={"limit": {"ge": 1, "le": 10000}}, doc="Who ran what on which image, newest first: a tenant's token sees its own records."))
@via("mcp", Off("the audit trail is the operator's (CLI, REST)"))
def audit(*, tenant: str | None = None, limit: int = D.AUDIT_LIMIT) -> list[dict]:
    """The audit trail, newest first (a tenant: its own)."""

@via("cli", Cli(handler="admin.cmd_fsck"))
@via("sdk", Sdk("the SDK's options are keyword-only", keyword=("verify_content",)))
@op(None, admin=True, http=Http(_P, "/admin/fsck", query=("verify_content",)))
@via("mcp", Off("admin: the store's upkeep is the operator's"))
def fsck(verify_content: bool = True) -> dict:
    """Check the store; verify_content re-hashes every blob."""

@via("cli", Cli(show="gc"))
@via("sdk", Sdk("the SDK's options are keyword-only", keyword=("retention", "grace")))
@op(None, admin=True, audit="gc", http=Http(_P, "/admin/gc", query=("retention", "grace")))
@via("mcp", Off("admin: the store's upkeep is the operator's"))
def gc(retention: float = D.GC_RETENTION, grace: float = D.GC_GRACE) -> dict:
    """Remove unreachable images and data older than `retention` (never younger than `grace`)."""

@via("cli", Cli("secret set", handler="secrets.cmd_secret"))
@via("sdk", Sdk("hosts reads as an option: st.set_secret(\"NAME\", value, hosts=[...])", keyword=("hosts",)))
@op("run", caller=True, audit="secret set", http=Http(_U, "/secrets/{name}", body=("value", "hosts", "tenants", "tenant"), model="SecretIn", types={"hosts": "list[str] | str"}, doc='Store a secret runs name (secrets=["NAME"]): its name, hosts and times come back, never its value.', model_doc="PUT /secrets/{name}: a stored secret (the value is never in an answer, a log or the audit)."))
@via("mcp", Off("secrets are stored by the operator or the token's owner (sandtree secret set), not by an agent"))
def secret_set(name: str, value: str, hosts: list[str], *, tenants: list[str] | None = None, tenant: str | None = None) -> dict:
    """Store a secret that runs name (secrets=["NAME"]), kept outside the database; its value is never shown again."""
@via("cli", Cli("secret list", show="secrets"))
@op("list", caller=True, http=Http(_G, "/secrets", query=("tenant",), doc="The stored secrets the caller may use (its own, and the operator's shared with it)."))
@via("mcp", Mcp(params=(), result=Result(keep=("name", "hosts", "owner")), doc="""The server's stored secrets you may use: name and hosts (never a value). Pass them to run or
        sandbox_start as secrets=["NAME"]: $NAME in the sandbox is a placeholder that the egress path
        replaces with the value in requests to those hosts only (needs a network policy reaching them).
        Secrets are stored by the operator or your token's owner (`sandtree secret set`), not here."""))
def secret_list(*, tenant: str | None = None) -> list[dict]:
    """The stored secrets the caller may use: name, hosts, owner, times (never a value)."""
@via("cli", Cli("secret rm", show="secret_removed"))
@op("run", caller=True, audit="secret remove", http=Http(_X, "/secrets/{name}", query=("tenant",)))
@via("mcp", Off("secrets are stored by the operator or the token's owner (sandtree secret set), not by an agent"))
def secret_remove(name: str, *, tenant: str | None = None) -> None:
    """Forget a stored secret (runs and sandboxes already started keep theirs)."""

@via("cli", Cli("tape show"))
@op("list", http=Http(_G, "/tapes/{tape}", query=("limit",)))
@via("mcp", Mcp(doc="""An egress tape's exchanges, in the order they happened: kind (dns, http, https, tcp), host,
        method, path, status, request and response bytes, seconds after the start. A run started with
        record=True (and network) keeps a tape; its ID is the run's usage["tape"]; replay=ID answers a
        later run from it with no network."""))
def tape_show(tape: str, *, limit: int = D.TAPE_SHOW_LIMIT) -> dict:
    """An egress tape: the run that recorded it, the tape it extends, its size, and its exchanges in order (kind, host, method, path, status, request and response bytes, time)."""

# ---- operations: runs submitted now, awaited later (engine.operations.<name>) ---------------------------
@via("cli", Off("an operation submitted now and awaited later lives in a serving process (`sandtree op ID` shows a record)"))
@op("run", images=("ref",), audit="run", group="operations", http=Http(_P, "/runs"), custom_remote=True, kwargs_of="run")
@via("mcp", _MCP_RUN)
def submit_run(ref: str, command, **options) -> str:
    """Start a run and return its operation ID at once (the options are run's)."""

@via("cli", Off("an operation submitted now and awaited later lives in a serving process (`sandtree op ID` shows a record)"))
@via("sdk", Off("st.operation(op) is this record"))
@op("list", group="operations", http=Http(_G, "/operations/{op}"))
@via("mcp", Mcp(name="get_operation", handler="get_operation", rename={"op": "operation_id"}, extra=("offset",)))
def get(op: str) -> dict:
    """An operation's record and status."""

@via("cli", Off("an operation submitted now and awaited later lives in a serving process (`sandtree op ID` shows a record)"))
@op("list", group="operations", http=Http(_P, "/operations/{op}/wait", query=("timeout",), name="wait_operation", handler="wait_operation", defaults={"timeout": D.OPERATION_WAIT}, bounds={"timeout": {"ge": 0, "le": D.WAIT_MAX}}), custom_remote=True)
@via("mcp", Mcp(name="wait_operations", handler="wait_operations", rename={"ops": "operation_ids"}, defaults={"timeout": D.MCP_WAIT}))
def wait(ops: list[str], timeout: float | None = None) -> list[dict]:
    """Wait for operations to end; their records, in order."""

@via("cli", Off("an operation submitted now and awaited later lives in a serving process (`sandtree op ID` shows a record)"))
@via("sdk", Off("st.wait(ops) gives the records; st.engine.operations.result the whole output"))
@op("list", group="operations", http=Http(_G, "/operations/{op}"), custom_remote=True)
@via("mcp", Mcp(name="get_operation", handler="get_operation", rename={"op": "operation_id"}))
def result(op: str):
    """A finished run's record with its whole output (None while it runs)."""

@via("cli", Off("an operation submitted now and awaited later lives in a serving process (`sandtree op ID` shows a record)"))
@op("cancel", audit="cancel", group="operations", http=Http(_P, "/operations/{op}/cancel", name="cancel_operation"))
@via("mcp", Mcp(name="cancel_operation", handler="cancel_operation", rename={"op": "operation_id"}))
def cancel(op: str) -> dict:
    """Stop a submitted operation."""

@via("cli", Off("an operation submitted now and awaited later lives in a serving process (`sandtree op ID` shows a record)"))
@via("sdk", Off("the SDK waits for the operations it submitted (st.wait); st.engine.operations.list lists them"))
@op("list", group="operations", http=Http(_G, "/operations", query=("status", "limit", "kind"), name="list_operations", bounds={"limit": {"ge": 1, "le": 1000}}))
@via("mcp", Mcp(name="list_operations", handler="list_operations", defaults={"limit": D.MCP_OPERATIONS_LIMIT}))
def list(*, status: str | None = None, limit: int = D.OPERATIONS_LIMIT, kind: str = "run") -> list[dict]:   # noqa: A001
    """Operations, newest first (status: queued, running, done, failed, cancelled)."""

ENGINE_OPS = {k: v for k, v in OPS.items() if v.group == "engine"}
OPERATIONS_OPS = {v.name: v for v in OPS.values() if v.group == "operations"}
del list                                  # the row above; `list` is the builtin again below this line
