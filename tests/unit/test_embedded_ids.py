"""The embedded broker's storage format arguments."""

import uuid

from rmq_semantics import embedded


def test_cluster_id_never_starts_with_a_dash(monkeypatch):
    # 0xfb... encodes to "-..." in URL-safe base64; StorageTool would read it as an option.
    ids = iter([uuid.UUID(bytes=b"\xfb" + bytes(15)), uuid.UUID(bytes=b"\x01" + bytes(15))])
    monkeypatch.setattr(embedded.uuid, "uuid4", lambda: next(ids))
    cluster_id = embedded.new_cluster_id()
    assert cluster_id == "AQAAAAAAAAAAAAAAAAAAAA"
