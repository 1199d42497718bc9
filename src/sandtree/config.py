"""Where settings come from: the only module that reads the environment (tests/conformance/test_architecture.py
holds every other module to that), so what a deployment can set is listed here."""

from __future__ import annotations

import os


def default_home() -> str:
    home = os.environ.get("SANDTREE_HOME")
    if home:
        return home
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "sandtree")


_database: list[str] = []          # set by `--database` (cli/main.py): wins over the environment


def use_database(url: str | None) -> None:
    """`sandtree --database URL`: the metadata database of every store this process opens."""
    _database[:] = [url] if url else []


def database_url() -> str | None:
    """The store's metadata database: `--database`, else SANDTREE_DATABASE_URL (postgresql://...);
    None: SQLite in the store's home (store/db.py open_database)."""
    if _database:
        return _database[0]
    return os.environ.get("SANDTREE_DATABASE_URL") or None


_objects: list[str] = []           # set by `--objects` (cli/main.py): wins over the environment


def use_objects(url: str | None) -> None:
    """`sandtree --objects s3://bucket/prefix`: where every store this process opens keeps objects."""
    _objects[:] = [url] if url else []


def objects_url() -> str | None:
    """The store's object storage: `--objects`, else SANDTREE_OBJECTS_URL (s3://bucket/prefix);
    None: the store's own directory only (store/s3objects.py)."""
    if _objects:
        return _objects[0]
    return os.environ.get("SANDTREE_OBJECTS_URL") or None


def s3_endpoint() -> str | None:
    """The S3 server for a non-AWS store (SeaweedFS, MinIO, Ceph): SANDTREE_S3_ENDPOINT, else the
    AWS SDK's own AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL. Credentials and region are boto3's usual
    chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ~/.aws/credentials and config)."""
    return (os.environ.get("SANDTREE_S3_ENDPOINT") or os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL") or None)


def layer_cache_max() -> int | None:
    """SANDTREE_CACHE_MAX: the size cap in bytes (suffixes K, M, G) of a store's local layer cache
    when its objects are in S3 (store/layercache.py); None: defaults.LAYER_CACHE_MAX."""
    raw = (os.environ.get("SANDTREE_CACHE_MAX") or "").strip().upper()
    if not raw:
        return None
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(raw[-1], 1)
    try:
        return int(float(raw.rstrip("KMGT")) * mult)
    except ValueError:
        return None


def durability() -> str | None:
    """SANDTREE_DURABILITY: `strict` (the default: an image ID returned survives a power cut) or
    `relaxed` (a power cut may lose the last seconds of commits; the store stays consistent):
    store/durable.py. None: not set."""
    return os.environ.get("SANDTREE_DURABILITY") or None


_cluster: list[str] = []           # set by `--cluster` (cli/main.py): wins over the environment


def use_cluster(address: str | None) -> None:
    """`sandtree --cluster ADDRESS`: the Ray cluster every engine this process opens sends runs to."""
    _cluster[:] = [address] if address else []


def cluster_address() -> str | None:
    """The Ray cluster runs go to: `--cluster`, else SANDTREE_CLUSTER (`auto`, `HOST:PORT` or
    `ray://HOST:PORT`); None: runs stay in this process (no cluster)."""
    if _cluster:
        return _cluster[0]
    return os.environ.get("SANDTREE_CLUSTER") or None


def node_home() -> str | None:
    """SANDTREE_NODE_HOME, read on a cluster node (a Ray node's environment, set where `ray start`
    runs): that node's own store directory, its layer cache and work dirs. None: the cluster's
    default (cluster/scheduling.py NodeConfig.home_for)."""
    return os.environ.get("SANDTREE_NODE_HOME") or None


def criu_binary() -> str | None:
    """SANDTREE_CRIU: a CRIU binary to use instead of the installed one (runtime/criu.py)."""
    return os.environ.get("SANDTREE_CRIU") or None


def inherited_environment() -> dict[str, str]:
    """The environment a host tool the engine runs for itself gets (the C compiler building the
    helpers: its PATH, its locale); never a sandbox's, which starts from the run's env only."""
    return dict(os.environ)


def remote_token() -> str | None:
    """SANDTREE_TOKEN: the bearer token `sandtree mcp --url` (and scripts) present to a server."""
    return os.environ.get("SANDTREE_TOKEN") or None


def registry_token() -> str:
    """SANDTREE_REGISTRY_TOKEN: the secret `sandtree registry login` stores, when not on stdin."""
    return os.environ.get("SANDTREE_REGISTRY_TOKEN", "")


def terminal_type() -> str:
    """TERM of the terminal `sandtree shell` runs in, passed to the shell in the sandbox."""
    return os.environ.get("TERM", "xterm")


def network_default() -> str:
    """SANDTREE_NETWORK_DEFAULT: the policy a Contree client's `networking.enabled: true` gets
    (network/policy.py values: "all" (default), a comma list of rules, "off")."""
    return os.environ.get("SANDTREE_NETWORK_DEFAULT") or "all"


def egress_upstream() -> tuple[str | None, str | None, str | None]:
    """Where the egress daemon's outbound connections go (network/daemon.py), for tests and
    deployments that name another than the host's: SANDTREE_EGRESS_NETNS (a network namespace's
    path, e.g. /run/netns/up or /proc/PID/ns/net), SANDTREE_EGRESS_DNS ("ip[:port]", the upstream
    DNS server; default the host's first nameserver) and SANDTREE_EGRESS_CA (a CA bundle trusted
    for upstream TLS besides the system's)."""
    return (os.environ.get("SANDTREE_EGRESS_NETNS") or None, os.environ.get("SANDTREE_EGRESS_DNS") or None,
            os.environ.get("SANDTREE_EGRESS_CA") or None)


def egress_relay() -> str:
    """How the egress daemon relays decided opaque connections: SANDTREE_EGRESS_RELAY=splice (the
    default: splice(2) through a pipe, network/splice.py) or kernel (a BPF sockmap, network/
    fastpath.py; it falls back to splice where the kernel can not). Anything else is splice."""
    return "kernel" if os.environ.get("SANDTREE_EGRESS_RELAY", "").strip().lower() == "kernel" else "splice"
