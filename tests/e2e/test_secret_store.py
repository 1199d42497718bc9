"""The server's secret store (issue 14 item 6, "from the server's secret store"): a secret stored
once (name, value, hosts) and used by name from Python, the CLI and REST; the value reaches the
test server only for its hosts, over HTTPS through the per-link CA (a static OpenSSL client in the
sandbox that verifies against $SSL_CERT_FILE), never over plain HTTP; another tenant can neither use
nor list it; a request narrows the stored hosts and never widens them; the value is in no record,
log, audit row, image or /proc/*/environ (the whole store directory is grepped, the secrets file
excepted).

Real things only: the engine on a temporary store, the real egress daemon (root, nft) whose upstream
is a netlab internet this module made (tests/netlab.py: HTTP on 80, HTTPS on 443 with the lab's own
CA, which the daemon trusts), a real `sandtree serve` on loopback. No packet leaves namespaces made
here; the daemon is stopped at teardown."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys

import httpx
import pytest

import sandtree
from conftest import free_port, make_rootfs, wait_for_port
from netlab import NetLab
from sandtree.engine import Engine
from sandtree.errors import Forbidden, InvalidInput, NotFound
from sandtree.network.client import Egress
from sandtree.network.secretstore import SecretStore
from sandtree.network.trust import parse_secrets

NEEDS_ROOT = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("nft"), reason="needs root and nft")
SECRET = "stored-REAL-value-5e0c9b1d44"
SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src")

TLSGET = r"""
/* tlsget IP PORT NAME PATH: TLS to IP:PORT with SNI NAME, verified (name and chain) against
 * $SSL_CERT_FILE; GET PATH with "Authorization: Bearer $TOKEN"; the answer on stdout. */
#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (argc < 5) return 2;
    const char *bundle = getenv("SSL_CERT_FILE"), *token = getenv("TOKEN");
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!bundle || SSL_CTX_load_verify_locations(ctx, bundle, NULL) != 1) { fprintf(stderr, "no bundle\n"); return 3; }
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(argv[2]))};
    inet_pton(AF_INET, argv[1], &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) { perror("connect"); return 4; }
    SSL *ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    SSL_set_tlsext_host_name(ssl, argv[3]);
    SSL_set1_host(ssl, argv[3]);
    if (SSL_connect(ssl) != 1) { ERR_print_errors_fp(stderr); return 5; }
    char req[4096];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"
                     "Connection: close\r\n\r\n", argv[4], argv[3], token ? token : "");
    SSL_write(ssl, req, n);
    char buf[16384];
    while ((n = SSL_read(ssl, buf, sizeof buf)) > 0) fwrite(buf, 1, (size_t)n, stdout);
    return 0;
}
"""

# Both netlab hosts, one request each: HTTPS (through the interceptor when the secret is for the
# host) and plain HTTP on 80 (busybox nc: never a value, only the placeholder); the lab records what
# arrived.
SCRIPT = ("tlsget 11.1.1.10 443 allowed.test /tls; echo; echo --; tlsget 11.1.1.11 443 other.test /tls; echo; "
          "echo --; printf 'GET /plain HTTP/1.1\\r\\nHost: allowed.test\\r\\nAuthorization: Bearer %s\\r\\n"
          "Connection: close\\r\\n\\r\\n' \"$TOKEN\" | nc -w 5 11.1.1.10 80; echo; "
          "cat /proc/[0-9]*/environ > /env-dump 2>/dev/null; echo \"$TOKEN\" > /token-seen")


@pytest.fixture(scope="module")
def lab():
    if os.geteuid() != 0 or not shutil.which("nft"):
        pytest.skip("the netlab and the egress daemon need root and nft")
    lab = NetLab()
    yield lab
    lab.close()


def add_tls_client(root: str, ca_file: str) -> None:
    """/bin/tlsget (static OpenSSL) into rootfs `root`, and `ca_file` (the lab's CA) as its own trust
    store (so a host no secret is for verifies too). Skips the test when no static OpenSSL client
    can be built here."""
    src = os.path.join(os.path.dirname(root), "tlsget.c")
    with open(src, "w") as f:
        f.write(TLSGET)
    p = subprocess.run(["cc", "-static", "-O1", "-o", os.path.join(root, "bin", "tlsget"), src,
                        "-lssl", "-lcrypto", "-lpthread"], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot build a static OpenSSL client here: {p.stderr[-300:]}")
    os.makedirs(os.path.join(root, "etc", "ssl", "certs"), exist_ok=True)
    shutil.copy(ca_file, os.path.join(root, "etc", "ssl", "certs", "ca-certificates.crt"))


def make_tls_rootfs(d, ca_file: str) -> str:
    """The busybox image (in directory `d`) with add_tls_client's and an /etc/resolv.conf to bind over."""
    root = make_rootfs(os.path.join(str(d), "root"))
    add_tls_client(root, ca_file)
    with open(os.path.join(root, "etc", "resolv.conf"), "w") as f:
        f.write("nameserver 192.0.2.53\n")
    return root


@pytest.fixture(scope="module")
def rootfs_tls(tmp_path_factory, lab):
    return make_tls_rootfs(tmp_path_factory.mktemp("secret-store-root"), lab.ca_file)


@pytest.fixture(scope="module")
def eng(tmp_path_factory, lab):
    e = Engine(str(tmp_path_factory.mktemp("secret-store") / "st"), warm=0)
    e._egress = Egress(e.store.home, upstream_netns=lab.path, upstream_dns=f"{lab.dns[0]}:{lab.dns[1]}",
                       upstream_ca=lab.ca_file)
    yield e
    e._egress.stop_daemon()
    e.close()


def arrived(lab, since: int) -> dict:
    """path -> {host: Authorization} of the lab's requests since `since`."""
    out: dict = {}
    for r in lab.requests[since:]:
        out.setdefault(r["path"], {})[r["headers"].get("host")] = r["headers"].get("authorization")
    return out


def grep_store(home: str, needle: str) -> list[str]:
    """Files under the store holding `needle`, the secret store's own files excepted."""
    hits = []
    secrets_dir = os.path.join(home, "secrets")
    for top, _, names in os.walk(home):
        if top == secrets_dir:
            continue
        for name in names:
            path = os.path.join(top, name)
            if os.path.isfile(path) and not os.path.islink(path) and os.path.getsize(path) < 256 << 20:
                with open(path, "rb") as f:
                    if needle.encode() in f.read():
                        hits.append(path)
    return hits


# ---- the store: files, modes, typed errors (no daemon) -----------------------------------------------

def test_values_live_in_0600_files_of_a_0700_directory_never_in_the_database(tmp_path):
    e = Engine(str(tmp_path / "st"), warm=0)
    try:
        info = e.secret_set("API_TOKEN", SECRET, ["api.example.org", "*.example.net"])
        assert info["name"] == "API_TOKEN" and info["hosts"] == ["api.example.org", "*.example.net"]
        assert SECRET not in json.dumps(info) + json.dumps(e.secret_list())
        d = os.path.join(e.home, "secrets")
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
        files = [f for f in os.listdir(d) if f.endswith(".json")]
        assert files and all(stat.S_IMODE(os.stat(os.path.join(d, f)).st_mode) == 0o600 for f in files)
        assert grep_store(e.home, SECRET) == []                     # not in sandtree.db, its WAL, anywhere
        with open(os.path.join(d, files[0]), "rb") as f:
            assert SECRET.encode() in f.read()                      # (the grep could find it)
        # replacing keeps created; rm forgets; rm again is NotFound
        again = e.secret_set("API_TOKEN", SECRET + "2", "api.example.org")
        assert again["created"] == info["created"] and again["hosts"] == ["api.example.org"]
        e.secret_remove("API_TOKEN")
        assert e.secret_list() == []
        with pytest.raises(NotFound):
            e.secret_remove("API_TOKEN")
        audit = [r for r in e.audit(limit=10) if r["action"].startswith("secret")]
        assert [r["action"] for r in audit] == ["secret remove", "secret set", "secret set"]
        assert all(r["secret"] == "API_TOKEN" for r in audit) and SECRET not in json.dumps(audit)
    finally:
        e.close()


@pytest.mark.parametrize("name, value, hosts, match", [
    ("1BAD", SECRET, ["a.org"], "environment variable"),
    ("SSL_CERT_FILE", SECRET, ["a.org"], "trust-store"),
    ("OK", "a\nb" + SECRET, ["a.org"], "CR, LF or NUL"),
    ("OK", "abc", ["a.org"], "shorter"),
    ("OK", SECRET, [], "hosts"),
    ("OK", SECRET, ["10.0.0.1"], "host name"),
    ("OK", SECRET, ["*"], "host name"),
])
def test_bad_secrets_are_refused_typed_and_change_nothing(tmp_path, name, value, hosts, match):
    e = Engine(str(tmp_path / "st"), warm=0)
    try:
        with pytest.raises(InvalidInput, match=match) as exc:
            e.secret_set(name, value, hosts)
        assert value not in str(exc.value)                          # the message names, never shows
        assert e.secret_list() == []
    finally:
        e.close()


def test_a_reference_narrows_the_stored_hosts_and_never_widens_them(tmp_path):
    store = SecretStore(str(tmp_path / "secrets"))
    store.set(None, "TOKEN", SECRET, ["allowed.test", "*.example.org"])
    look = lambda ref: store.get(None, ref) or (_ for _ in ()).throw(NotFound(f"no stored secret {ref!r}"))  # noqa: E731
    (s,) = parse_secrets(["TOKEN"], stored=look)
    assert s.value == SECRET and s.hosts == ("allowed.test", "*.example.org") and s.stored == "TOKEN"
    assert s.placeholder.startswith("sandtree-secret-TOKEN-")
    (s,) = parse_secrets({"TOKEN": {"stored": True, "hosts": ["api.example.org"]}}, stored=look)
    assert s.hosts == ("api.example.org",)
    (s,) = parse_secrets({"OTHER_NAME": {"stored": "TOKEN"}}, stored=look)        # under another name
    assert s.name == "OTHER_NAME" and s.value == SECRET
    for wider in (["other.test"], ["*.test"], ["example.org"], ["allowed.test", "evil.test"]):
        with pytest.raises(Forbidden, match="narrow"):
            parse_secrets({"TOKEN": {"stored": True, "hosts": wider}}, stored=look)
    with pytest.raises(NotFound):
        parse_secrets(["NOPE"], stored=look)
    with pytest.raises(InvalidInput, match="exactly one"):
        parse_secrets({"TOKEN": {"stored": True, "value": SECRET, "hosts": ["allowed.test"]}}, stored=look)
    with pytest.raises(InvalidInput, match="not available"):
        parse_secrets(["TOKEN"])


def test_tenants_see_and_use_only_their_own_and_what_the_operator_shares(tmp_path):
    e = Engine(str(tmp_path / "st"), warm=0)
    try:
        t = e.tenancy
        alice = e.as_tenant(t.authenticate(t.create_token("alice", network="any")["token"]))
        bob = e.as_tenant(t.authenticate(t.create_token("bob", network="any")["token"]))
        alice.secret_set("TOKEN", SECRET, ["allowed.test"])
        e.secret_set("SHARED", SECRET + "-op", ["allowed.test"], tenants=["alice"])
        e.secret_set("PRIVATE", SECRET + "-op2", ["allowed.test"])
        assert {s["name"]: s["owner"] for s in alice.secret_list()} == {"TOKEN": "alice", "SHARED": "global"}
        assert "tenants" not in json.dumps(alice.secret_list())    # who else may use it is the operator's
        assert bob.secret_list() == []
        assert [s["name"] for s in e.secret_list()] == ["PRIVATE", "SHARED"]
        assert [s["name"] for s in e.secret_list(tenant="alice")] == ["TOKEN"]
        with pytest.raises(Forbidden):
            bob.secret_list(tenant="alice")
        with pytest.raises(Forbidden):
            bob.secret_remove("TOKEN", tenant="alice")
        with pytest.raises(Forbidden):
            alice.secret_set("X", SECRET, ["allowed.test"], tenants=["bob"])
        with pytest.raises(NotFound):
            bob.secret_remove("TOKEN")
        # use: the lookup behind a run's secrets= (exactly NotFound for another's and for none)
        look = t.stored_secret
        assert look("alice~TOKEN").value == SECRET and look("alice~SHARED").value == SECRET + "-op"
        for ref in ("bob~TOKEN", "bob~SHARED", "alice~PRIVATE", "TOKEN", "alice~NOPE"):
            with pytest.raises(NotFound, match="no stored secret"):
                look(ref)
        img = e.import_path(make_rootfs(str(tmp_path / "root")))
        e.share(img)
        before = e.store.db.one("SELECT count(*) FROM operations")[0]
        for who, ref in ((bob, ["TOKEN"]), (bob, ["alice~TOKEN"]), (alice, ["PRIVATE"]),
                         (bob, {"X": {"stored": "alice~TOKEN"}})):
            with pytest.raises(NotFound, match="no stored secret"):
                who.run(img, "true", network=["allowed.test"], secrets=ref)
            with pytest.raises(NotFound, match="no stored secret"):
                who.sandbox_start(img, network=["allowed.test"], secrets=ref)
        assert e.store.db.one("SELECT count(*) FROM operations")[0] == before
        audit = alice.audit()
        assert [r["action"] for r in audit if r["action"].startswith("secret")] == ["secret set"]
        assert SECRET not in json.dumps(e.audit(limit=100))
    finally:
        e.close()


# ---- use by name, end to end (root, the netlab, the egress daemon) ------------------------------------

@NEEDS_ROOT
def test_python_stored_secret_reaches_only_its_hosts_over_https_and_http(eng, lab, rootfs_tls, tmp_path):
    img = eng.import_path(rootfs_tls)
    eng.secret_set("TOKEN", SECRET, ["allowed.test"])
    st = sandtree.Sandtree.__new__(sandtree.Sandtree)
    st._engine = eng                                         # the SDK's face over this engine
    assert [s["name"] for s in st.secrets()] == ["TOKEN"]
    n = len(lab.requests)
    r = st.image(img).run(SCRIPT, network=["allowed.test", "other.test"], secrets=["TOKEN"], disposable=False)
    got = arrived(lab, n)
    assert got["/tls"]["allowed.test"] == f"Bearer {SECRET}", (got, r.stdout, r.stderr)
    assert got["/tls"]["other.test"].startswith("Bearer sandtree-secret-TOKEN-"), got
    assert got["/plain"]["allowed.test"].startswith("Bearer sandtree-secret-TOKEN-"), got   # not in clear
    assert SECRET.encode() not in r.stdout + r.stderr              # the echoes come back masked
    assert eng.read(r.image.id, "/token-seen").startswith(b"sandtree-secret-TOKEN-")
    assert SECRET.encode() not in eng.read(r.image.id, "/env-dump")
    spec = eng.operation(r.operation)["spec"]
    assert spec["secrets"] == {"TOKEN": {"hosts": ["allowed.test"], "stored": "TOKEN"}}
    tar = tmp_path / "image.tar"
    with open(tar, "wb") as f:
        eng.export_tar(r.image.id, f)
    assert SECRET.encode() not in tar.read_bytes()
    assert grep_store(eng.home, SECRET) == []


@NEEDS_ROOT
def test_a_narrowed_stored_secret_goes_to_fewer_hosts_and_a_wider_one_runs_nothing(eng, lab, rootfs_tls):
    img = eng.import_path(rootfs_tls)
    eng.secret_set("TOKEN", SECRET, ["allowed.test", "other.test"])
    n = len(lab.requests)
    rec = eng.run(img, SCRIPT, network=["allowed.test", "other.test"],
                  secrets={"TOKEN": {"stored": True, "hosts": ["allowed.test"]}})
    got = arrived(lab, n)
    assert got["/tls"]["allowed.test"] == f"Bearer {SECRET}", (got, rec.stderr)
    assert got["/tls"]["other.test"].startswith("Bearer sandtree-secret-TOKEN-"), got
    assert eng.operation(rec.op)["spec"]["secrets"]["TOKEN"]["hosts"] == ["allowed.test"]
    eng.secret_set("TOKEN", SECRET, ["allowed.test"])
    before = eng.store.db.one("SELECT count(*) FROM operations")[0]
    with pytest.raises(Forbidden, match="narrow"):
        eng.run(img, "true", network=["allowed.test", "other.test"],
                secrets={"TOKEN": {"stored": True, "hosts": ["allowed.test", "other.test"]}})
    with pytest.raises(Forbidden, match="narrow"):
        eng.sandbox_start(img, network="all", secrets={"TOKEN": {"stored": True, "hosts": ["*.test"]}})
    assert eng.store.db.one("SELECT count(*) FROM operations")[0] == before and eng.sandbox_list() == []


@NEEDS_ROOT
def test_a_live_sandbox_uses_a_stored_secret_by_name(eng, lab, rootfs_tls):
    img = eng.import_path(rootfs_tls)
    eng.secret_set("TOKEN", SECRET, ["allowed.test"])
    info = eng.sandbox_start(img, network=["allowed.test", "other.test"], secrets=["TOKEN"])
    try:
        assert info["secrets"] == {"TOKEN": {"hosts": ["allowed.test"], "stored": "TOKEN"}}
        n = len(lab.requests)
        r = eng.sandbox_exec(info["id"], "tlsget 11.1.1.10 443 allowed.test /live; tlsget 11.1.1.11 443 other.test /live")
        got = arrived(lab, n)
        assert got["/live"]["allowed.test"] == f"Bearer {SECRET}", (got, r.stderr)
        assert got["/live"]["other.test"].startswith("Bearer sandtree-secret-TOKEN-"), got
        image = eng.sandbox_commit(info["id"])
    finally:
        eng.sandbox_stop(info["id"])
    assert grep_store(eng.home, SECRET) == [] and image


def cli_env(lab, home) -> dict:
    return {**os.environ, "SANDTREE_HOME": home, "SANDTREE_EGRESS_NETNS": lab.path,
            "SANDTREE_EGRESS_DNS": f"{lab.dns[0]}:{lab.dns[1]}", "SANDTREE_EGRESS_CA": lab.ca_file, "PYTHONPATH": SRC}


@NEEDS_ROOT
def test_cli_secret_set_list_rm_and_run_by_name(tmp_path, lab, rootfs_tls):
    home = str(tmp_path / "home")
    env = cli_env(lab, home)

    def cli(*args, check=True, input=None):
        p = subprocess.run([sys.executable, "-m", "sandtree", *args], env=env, capture_output=True, timeout=120,
                           input=input)
        assert not check or p.returncode == 0, p.stderr.decode()
        return p
    try:
        img = json.loads(cli("image", "import", rootfs_tls, "--json").stdout)["image"]
        p = cli("secret", "set", "TOKEN", "--hosts", "allowed.test", input=(SECRET + "\n").encode())
        assert SECRET.encode() not in p.stdout + p.stderr
        (listed,) = json.loads(cli("secret", "list", "--json").stdout)
        assert listed["name"] == "TOKEN" and listed["hosts"] == ["allowed.test"] and "value" not in listed
        assert b"TOKEN" in cli("secret", "list").stdout
        n = len(lab.requests)
        p = cli("run", img, "--network", "allowed.test,other.test", "--secret", "TOKEN", "--json", "--",
                "sh", "-c", SCRIPT)
        got = arrived(lab, n)
        assert got["/tls"]["allowed.test"] == f"Bearer {SECRET}", (got, p.stdout)
        assert got["/tls"]["other.test"].startswith("Bearer sandtree-secret-TOKEN-"), got
        assert SECRET.encode() not in p.stdout + p.stderr
        wide = cli("run", img, "--network", "all", "--secret", "TOKEN@other.test", "--", "true", check=False)
        assert wide.returncode != 0 and b"narrow" in wide.stderr
        missing = cli("run", img, "--network", "all", "--secret", "NOPE", "--", "true", check=False)
        assert missing.returncode != 0 and b"no stored secret" in missing.stderr
        secret_file = tmp_path / "tok"
        secret_file.write_text(SECRET + "-file\n")
        cli("secret", "set", "FROMFILE", "--hosts", "allowed.test", "--from-file", str(secret_file))
        cli("secret", "rm", "TOKEN")
        assert [s["name"] for s in json.loads(cli("secret", "list", "--json").stdout)] == ["FROMFILE"]
        assert cli("secret", "rm", "TOKEN", check=False).returncode != 0
    finally:
        Egress(home).stop_daemon()
    assert grep_store(home, SECRET) == []


@NEEDS_ROOT
def test_rest_tenant_stores_and_uses_a_secret_another_tenant_cannot(tmp_path, lab, rootfs_tls):
    """A real `sandtree serve` with tokens: alice stores TOKEN (PUT /secrets/TOKEN) and runs with
    secrets=["TOKEN"] (REST and the remote SDK); bob neither lists nor uses it (404, as for none);
    the audit names the secret, never the value; neither the store nor the server's log holds it."""
    home = str(tmp_path / "home")
    e = Engine(home, warm=0)
    try:
        t = e.tenancy
        alice_tok = t.create_token("alice", network="any")["token"]
        bob_tok = t.create_token("bob", network="any")["token"]
        img = e.import_path(rootfs_tls)
        e.share(img)
    finally:
        e.close()
    port = free_port()
    log = open(tmp_path / "server.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "sandtree", "--home", home, "serve", "--port", str(port), "--ports-port", "0"],
                            env=cli_env(lab, home), stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_port(port, 30)
        alice = httpx.Client(base_url=url + "/api/v1", headers={"Authorization": f"Bearer {alice_tok}"}, timeout=120)
        bob = httpx.Client(base_url=url + "/api/v1", headers={"Authorization": f"Bearer {bob_tok}"}, timeout=120)
        r = alice.put("/secrets/TOKEN", json={"value": SECRET, "hosts": ["allowed.test"]})
        assert r.status_code == 200 and SECRET not in r.text, r.text
        bad = alice.put("/secrets/TOKEN2", json={"value": SECRET, "hosts": ["allowed.test"], "tenants": ["bob"]})
        assert bad.status_code == 403 and SECRET not in bad.text
        assert [s["name"] for s in alice.get("/secrets").json()] == ["TOKEN"]
        assert bob.get("/secrets").json() == []
        assert bob.get("/secrets", params={"tenant": "alice"}).status_code == 403
        n = len(lab.requests)
        r = alice.post("/runs", json={"image": img, "command": SCRIPT, "network": ["allowed.test", "other.test"],
                                      "secrets": ["TOKEN"]})
        assert r.status_code == 201, r.text
        got = arrived(lab, n)
        assert got["/tls"]["allowed.test"] == f"Bearer {SECRET}", (got, r.text[:500])
        assert got["/tls"]["other.test"].startswith("Bearer sandtree-secret-TOKEN-"), got
        assert r.json()["spec"]["secrets"] == {"TOKEN": {"hosts": ["allowed.test"], "stored": "TOKEN"}}
        for body in ({"secrets": ["TOKEN"]}, {"secrets": {"TOKEN": {"stored": True}}}):
            no = bob.post("/runs", json={"image": img, "command": "true", "network": ["allowed.test"], **body})
            assert no.status_code == 404 and no.json()["error"] == "not_found", no.text
        wide = alice.post("/runs", json={"image": img, "command": "true", "network": "all",
                                         "secrets": {"TOKEN": {"stored": True, "hosts": ["other.test"]}}})
        assert wide.status_code == 403, wide.text
        # the remote SDK, by name
        st = sandtree.connect(url, token=alice_tok)
        try:
            assert [s["name"] for s in st.secrets()] == ["TOKEN"]
            n = len(lab.requests)
            res = st.image(img).run("tlsget 11.1.1.10 443 allowed.test /sdk", network="allowed.test",
                                    secrets={"TOKEN": {"stored": True}})
            assert arrived(lab, n)["/sdk"]["allowed.test"] == f"Bearer {SECRET}", res.stderr
            st.remove_secret("TOKEN")
            assert st.secrets() == []
        finally:
            st.close()
        audit = alice.get("/audit").json()
        assert {"secret set", "secret remove"} <= {a["action"] for a in audit}
        assert all(a.get("secret") == "TOKEN" for a in audit if a["action"].startswith("secret"))
        assert SECRET not in json.dumps(audit)
        alice.close()
        bob.close()
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        log.close()
        Egress(home).stop_daemon()
    assert SECRET.encode() not in (tmp_path / "server.log").read_bytes()
    assert grep_store(home, SECRET) == []


@NEEDS_ROOT
def test_mcp_lists_and_uses_stored_secrets_by_name_only(tmp_path, lab, rootfs_tls):
    """MCP through the real client: secret_list shows names and hosts (never a value), no tool sets
    or reads one, and run takes secrets=["TOKEN"]: the lab's host gets the value, the sandbox the
    placeholder."""
    import asyncio

    from mcp.client.client import Client
    from mcp.client.stdio import StdioServerParameters
    home = str(tmp_path / "home")
    e = Engine(home, warm=0)
    try:
        e.secret_set("TOKEN", SECRET, ["allowed.test"])
        img = e.import_path(rootfs_tls)
    finally:
        e.close()
    params = StdioServerParameters(command=sys.executable, args=["-m", "sandtree", "--home", home, "mcp", "--tools", "all"],
                                   env=cli_env(lab, home))

    async def main():
        async with Client(params) as c:
            tools = {t.name: t for t in (await c.list_tools()).tools}
            assert "secret_list" in tools and not [n for n in tools if "secret" in n and n != "secret_list"]
            got = (await c.call_tool("secret_list", {})).content
            assert len(got) == 1                        # a list answers as one JSON array
            listed = json.loads(got[0].text)
            assert listed == [{"name": "TOKEN", "hosts": ["allowed.test"], "owner": "global"}], listed
            n = len(lab.requests)
            r = await c.call_tool("run", {"image": img, "command": "tlsget 11.1.1.10 443 allowed.test /mcp; echo $TOKEN",
                                          "network": ["allowed.test"], "secrets": ["TOKEN"]})
            assert not r.is_error, r.content[0].text
            out = json.loads(r.content[0].text)["stdout"]
            assert arrived(lab, n)["/mcp"]["allowed.test"] == f"Bearer {SECRET}"
            assert "sandtree-secret-TOKEN-" in out and SECRET not in out
            wide = await c.call_tool("run", {"image": img, "command": "true", "network": "all",
                                             "secrets": {"TOKEN": {"stored": True, "hosts": ["other.test"]}}})
            assert wide.is_error and "narrow" in wide.content[0].text
    try:
        asyncio.run(main())
    finally:
        Egress(home).stop_daemon()
    assert grep_store(home, SECRET) == []
