"""layerpack's unpack with writer threads (store/layerpack.py): the same layer, byte for byte, as
the serial path, and a refusal raised by a writer thread still refuses the layer."""

from __future__ import annotations

import base64
import io
import os
import tarfile

import pytest

from sandtree.errors import BadArchive
from sandtree.engine.core import default_idmap
from sandtree.store import layerpack
from sandtree.store.layercache import _Null
from sandtree.store.layerpack import HashingWriter

from conftest import make_rootfs


def _digest(d: str, idmap) -> str:
    w = HashingWriter(_Null())
    layerpack.pack(d, w, idmap)
    return w.h.hexdigest()


@pytest.mark.parametrize("writers", [1, 4])
def test_unpack_round_trip(tmp_path, writers):
    idm = default_idmap()
    root = make_rootfs(str(tmp_path / "root"))
    for dirpath, dirs, files in os.walk(root):
        for n in dirs + files:
            os.lchown(os.path.join(dirpath, n), idm.uid_base, idm.gid_base)
    special = os.path.join(root, "etc", "special")
    with open(special, "wb") as f:
        f.write(b"x" * 100)
    os.chown(special, idm.uid_base + 5, idm.gid_base + 7)
    os.chmod(special, 0o4755)                     # setuid survives the chown (order: owner, xattrs, mode)
    os.setxattr(special, "user.k", b"v")
    os.utime(special, ns=(123456789012345678, 123456789012345678))
    for i in range(500):                          # past the writers' batching
        with open(os.path.join(root, "usr", f"f{i}"), "wb") as f:
            f.write(os.urandom(i))
    buf = io.BytesIO()
    layerpack.pack(root, buf, idm)
    out = tmp_path / "out"
    out.mkdir()
    layerpack.unpack(io.BytesIO(buf.getvalue()), str(out), idm, 1 << 40, writers=writers)
    assert _digest(str(out), idm) == _digest(root, idm)
    st = os.lstat(out / "etc" / "special")
    assert (oct(st.st_mode & 0o7777), st.st_uid - idm.uid_base, st.st_mtime_ns) == ("0o4755", 5, 123456789012345678)
    assert os.getxattr(out / "etc" / "special", "user.k") == b"v"


def test_refusal_in_a_writer_thread_refuses_the_layer(tmp_path):
    idm = default_idmap()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT,
                      pax_headers={"SANDTREE.idmap": f"{idm.uid_base} {idm.gid_base} {idm.count}"}) as tar:
        d = tarfile.TarInfo(".")
        d.type = tarfile.DIRTYPE
        tar.addfile(d)
        f = tarfile.TarInfo("evil")
        f.size = 3
        f.pax_headers = {"SANDTREE.xattr.trusted.overlay.redirect": base64.b64encode(b"/etc").decode()}
        tar.addfile(f, io.BytesIO(b"abc"))        # small: written by a writer thread
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(BadArchive, match="trusted.overlay.redirect"):
        layerpack.unpack(io.BytesIO(buf.getvalue()), str(out), idm, 1 << 20, writers=4)
