"""A layer the database names but the store does not have fails a run with StoreCorrupt naming the
layer and where it was looked for (before: "sandbox setup failed at overlay: No such file or
directory", naming nothing). The shared case: two store directories on one PostgreSQL database
without shared objects, where one node's layers are not on the other."""

from __future__ import annotations

import os

import pytest

from sandtree.engine.core import Engine
from sandtree.errors import StoreCorrupt
from sandtree.store.layers import remove_tree


def test_a_deleted_layer_is_named_by_a_typed_error(tmp_path, rootfs):
    engine = Engine(str(tmp_path / "home"), warm=0)
    try:
        base = engine.import_path(rootfs)
        image = engine.run(base, ["sh", "-c", "echo x > /root/f"]).image
        layer = engine.store.image(image).layers[0]
        remove_tree(engine.store.layers.path(layer))          # (nothing is mounted in a store)
        with pytest.raises(StoreCorrupt) as err:
            engine.run(image, ["true"])
        assert layer in err.value.message and engine.store.layers.path(layer) in err.value.message
        assert err.value.details["layer"] == layer
        assert err.value.details["path"] == engine.store.layers.path(layer)
        assert engine.run(base, ["true"]).exit_code == 0       # the images still whole still run
    finally:
        engine.close()


def test_a_layer_of_another_node_on_a_shared_postgresql_database_is_named(tmp_path, rootfs, pg_cluster):
    database = pg_cluster.new_database()
    a = Engine(str(tmp_path / "node-a"), warm=0, database=database)
    b = Engine(str(tmp_path / "node-b"), warm=0, database=database)
    try:
        base = a.import_path(rootfs)
        layer = a.store.image(base).layers[0]
        with pytest.raises(StoreCorrupt) as err:
            b.run(base, ["true"])
        msg = err.value.message
        assert layer in msg and b.store.layers.path(layer) in msg and "PostgreSQL" in msg and "--objects" in msg
        assert err.value.details == {"layer": layer, "path": b.store.layers.path(layer), "store": b.store.home}
        assert os.path.isdir(a.store.layers.path(layer))
    finally:
        b.close()
        a.close()


def test_a_tenant_is_told_of_a_missing_layer_without_the_servers_paths(tmp_path, rootfs):
    """The same fault seen by a tenant: typed and naming the layer, but no path of the server's
    (the store's directory is the operator's to know: `<store>` stands for it)."""
    from sandtree.tenancy import Tenant
    engine = Engine(str(tmp_path / "home"), warm=0)
    try:
        alice = engine.as_tenant(Tenant("alice"))
        base = alice.import_path(rootfs, tag="base")
        image = alice.run("base", "echo x > /root/f").image
        layer = engine.store.image(image).layers[0]
        remove_tree(engine.store.layers.path(layer))
        with pytest.raises(StoreCorrupt) as err:
            alice.run(image, "true")
        told = err.value.to_dict()
        assert layer in err.value.message and err.value.details["layer"] == layer
        assert engine.store.home not in str(told) and "<store>/layers" in err.value.message, told
        assert alice.run(base, "true").exit_code == 0
    finally:
        engine.close()
