"""API keys (docstream/api/keys.py) and `docstream api keys`: hashed at rest, verified in constant
time, None for anything hostile, revocable, listed without secrets, private on disk."""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from docstream.api.keys import LAST_USED_EVERY_S, KeyStore, Principal
from docstream.blobstore import BlobStore
from docstream.cli import app
from docstream.errors import ConfigurationError
from docstream.settings import Settings

runner = CliRunner()


@pytest.fixture
def store(tmp_path: Path) -> KeyStore:
    return KeyStore(BlobStore(str(tmp_path / "blobs")))


def _files(store: KeyStore) -> list[Path]:
    root = Path(store.blobs.resolve(store.blobs.uri("state/api/keys/x"))).parent
    return [p for p in root.iterdir() if p.is_file()]


def _secret(key: str) -> str:
    return key.split("_", 2)[2]


def test_a_created_key_verifies_to_its_tenant(store: KeyStore) -> None:
    created = store.create("acme", label="ci")
    assert created.key.startswith(f"dsk_{created.key_id}_")
    assert len(_secret(created.key)) >= 43
    assert store.verify(created.key) == Principal(tenant="acme", key_id=created.key_id)
    other = store.create("globex")
    assert store.verify(other.key) == Principal(tenant="globex", key_id=other.key_id)
    assert created.key != other.key and created.key_id != other.key_id


def test_the_database_holds_no_plaintext(store: KeyStore) -> None:
    created = [store.create("acme") for _ in range(3)]
    for c in created:
        assert store.verify(c.key) is not None
    raw = b"".join(p.read_bytes() for p in _files(store))
    for c in created:
        assert c.key.encode() not in raw
        assert _secret(c.key).encode() not in raw
        assert c.key_id.encode() in raw  # the id is stored; only the secret is not


@pytest.mark.parametrize(
    "presented",
    [
        "",
        "dsk_",
        "x" * 10_000_000,
        "dsk_" + "é" * 60,
        "dsk_\x00" * 16,
        "' OR 1=1 --",
        "dsk_0000000000000000_' OR '1'='1'; DROP TABLE api_keys; --AAAAAAA",
        "\ud800" * 64,
        "Bearer dsk_0123456789abcdef_" + "A" * 43,
        None,
        b"dsk_0123456789abcdef_" + b"A" * 43,
        42,
    ],
    ids=[
        "empty",
        "prefix",
        "huge",
        "non-ascii",
        "nul",
        "sql",
        "sql-shaped-key",
        "surrogates",
        "scheme",
        "none",
        "bytes",
        "int",
    ],
)
def test_hostile_input_gives_none(store: KeyStore, presented: object) -> None:
    store.create("acme")
    assert store.verify(presented) is None
    assert len(store.list()) == 1  # nothing dropped or changed


def test_a_wrong_secret_or_an_unknown_id_gives_none(store: KeyStore) -> None:
    created = store.create("acme")
    secret = _secret(created.key)
    wrong = secret[:-1] + ("B" if secret[-1] == "A" else "A")
    assert store.verify(f"dsk_{created.key_id}_{wrong}") is None
    unknown = "0" * 16 if created.key_id != "0" * 16 else "1" * 16
    assert store.verify(f"dsk_{unknown}_{secret}") is None
    other = store.create("globex")  # a real secret under another key's id
    assert store.verify(f"dsk_{created.key_id}_{_secret(other.key)}") is None
    assert store.verify(created.key.upper()) is None


def test_a_revoked_key_gives_none_and_stays_listed(store: KeyStore) -> None:
    created = store.create("acme")
    kept = store.create("acme")
    assert store.revoke(created.key_id) is True
    assert store.revoke(created.key_id) is False  # once
    assert store.revoke("0123456789abcdef") is False  # unknown
    assert store.revoke("'; DROP TABLE api_keys; --") is False
    assert store.verify(created.key) is None
    assert store.verify(kept.key) is not None
    listed = {k.key_id: k for k in store.list()}
    assert listed[created.key_id].revoked and not listed[kept.key_id].revoked
    assert KeyStore(store.blobs).verify(created.key) is None  # in the shared store, not in a cache


def test_a_revocation_reaches_another_replica_within_the_refresh(tmp_path: Path) -> None:
    """Two replicas share one store: one revokes, the other refuses the key once what it read of it
    is older than `refresh_s` (and not before: it does not read the store per request)."""
    blobs = BlobStore(str(tmp_path / "blobs"))
    now = [100.0]
    elsewhere = KeyStore(blobs, refresh_s=5.0, monotonic=lambda: now[0])
    created = KeyStore(blobs).create("acme")
    assert elsewhere.verify(created.key) is not None
    assert KeyStore(blobs).revoke(created.key_id)
    now[0] += 4.9
    assert elsewhere.verify(created.key) is not None  # read 4.9 s ago: still trusted
    now[0] += 0.2
    assert elsewhere.verify(created.key) is None


def test_a_key_made_after_a_miss_is_known_within_the_refresh(tmp_path: Path) -> None:
    blobs = BlobStore(str(tmp_path / "blobs"))
    now = [100.0]
    replica = KeyStore(blobs, refresh_s=5.0, monotonic=lambda: now[0])
    assert replica.verify("dsk_0123456789abcdef_" + "A" * 43) is None  # remembered as missing
    created = KeyStore(blobs).create("acme")
    now[0] += 5.1
    assert replica.verify(created.key) == Principal("acme", created.key_id)


def test_list_never_shows_a_secret_and_filters_by_tenant(store: KeyStore) -> None:
    a = store.create("acme", label="ci")
    b = store.create("globex")
    listed = store.list()
    assert [k.key_id for k in listed] == [a.key_id, b.key_id]  # oldest first
    assert [k.key_id for k in store.list("globex")] == [b.key_id]
    assert store.list("nobody") == ()
    text = repr(listed) + json.dumps([k.to_dict() for k in listed])
    for c in (a, b):
        assert _secret(c.key) not in text
    assert set(listed[0].to_dict()) == {
        "key_id",
        "tenant",
        "label",
        "created_at",
        "revoked_at",
        "last_used_at",
        "revoked",
    }


def test_last_used_is_written_at_most_once_a_minute(tmp_path: Path) -> None:
    now = [1_800_000_000.0]
    store = KeyStore(BlobStore(str(tmp_path / "blobs")), clock=lambda: now[0])
    created = store.create("acme")
    assert store.list()[0].last_used_at is None
    store.verify(created.key)
    first = store.list()[0].last_used_at
    assert first is not None and first.timestamp() == now[0]
    now[0] += LAST_USED_EVERY_S / 2
    store.verify(created.key)
    assert store.list()[0].last_used_at == first
    now[0] += LAST_USED_EVERY_S
    store.verify(created.key)
    last = store.list()[0].last_used_at
    assert last is not None and last.timestamp() == now[0]


def test_the_store_is_private(tmp_path: Path) -> None:
    store = KeyStore(BlobStore(str(tmp_path / "blobs")))
    store.create("acme")
    folder = tmp_path / "blobs" / "state" / "api" / "keys"
    for path in [folder, *folder.iterdir()]:
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path


def test_no_repr_shows_the_key(store: KeyStore) -> None:
    created = store.create("acme", label="ci")
    secret = _secret(created.key)
    for text in (repr(created), str(created), repr(store), repr(store.verify(created.key))):
        assert secret not in text
    assert created.key_id in repr(created)


@pytest.mark.parametrize("tenant", ["", "a b", "-acme", "x" * 129, "acme\n", "é", "a;b"])
def test_a_bad_tenant_is_refused(store: KeyStore, tenant: str) -> None:
    with pytest.raises(ConfigurationError, match="tenant"):
        store.create(tenant)
    with pytest.raises(ConfigurationError, match="tenant"):
        store.list(tenant)
    assert store.list() == ()


@pytest.mark.parametrize("label", ["", "x" * 201, "line\nbreak", "\x1b[31mred"])
def test_a_bad_label_is_refused(store: KeyStore, label: str) -> None:
    with pytest.raises(ConfigurationError, match="label"):
        store.create("acme", label=label)


def test_the_default_store_is_the_blob_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DOCSTREAM_BLOB_URL", raising=False)
    monkeypatch.setenv("DOCSTREAM_HOME", str(tmp_path))
    KeyStore.from_settings(Settings()).create("acme")
    assert len(list((tmp_path / "blobs" / "state" / "api" / "keys").iterdir())) == 1
    monkeypatch.setenv("DOCSTREAM_BLOB_URL", str(tmp_path / "elsewhere"))
    KeyStore.from_settings(Settings()).create("acme")
    assert len(list((tmp_path / "elsewhere" / "state" / "api" / "keys").iterdir())) == 1


# -- the command -------------------------------------------------------------------------------


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> BlobStore:
    monkeypatch.setenv("DOCSTREAM_BLOB_URL", str(tmp_path / "blobs"))
    return BlobStore(str(tmp_path / "blobs"))


def test_cli_create_prints_the_key_once(db: BlobStore) -> None:
    done = runner.invoke(app, ["api", "keys", "create", "--tenant", "acme", "--label", "ci"])
    assert done.exit_code == 0, done.output
    key = next(line for line in done.stdout.splitlines() if line.startswith("dsk_"))
    assert "cannot be shown again" in done.stdout
    assert KeyStore(db).verify(key) == Principal("acme", key.split("_")[1])
    listed = runner.invoke(app, ["api", "keys", "list"])
    assert listed.exit_code == 0 and _secret(key) not in listed.output
    assert key.split("_")[1] in listed.stdout and "acme" in listed.stdout and "1 API key," in listed.stdout


def test_cli_json_shapes(db: BlobStore) -> None:
    created = runner.invoke(app, ["api", "keys", "create", "--tenant", "acme", "--json"])
    assert created.exit_code == 0, created.output
    new = json.loads(created.stdout)
    assert set(new) == {"key_id", "tenant", "label", "created_at", "key", "note"}
    assert new["tenant"] == "acme" and new["label"] is None and "cannot be shown again" in new["note"]
    runner.invoke(app, ["api", "keys", "create", "--tenant", "globex", "--json"])

    listed = json.loads(runner.invoke(app, ["api", "keys", "list", "--json"]).stdout)
    assert [k["tenant"] for k in listed["keys"]] == ["acme", "globex"]
    assert _secret(new["key"]) not in json.dumps(listed)
    only = json.loads(runner.invoke(app, ["api", "keys", "list", "--tenant", "acme", "--json"]).stdout)
    assert [k["key_id"] for k in only["keys"]] == [new["key_id"]]

    revoked = runner.invoke(app, ["api", "keys", "revoke", new["key_id"], "--json"])
    assert revoked.exit_code == 0, revoked.output
    shown = json.loads(revoked.stdout)
    assert shown["revoked"] is True and shown["revoked_now"] is True and shown["revoked_at"]
    again = json.loads(runner.invoke(app, ["api", "keys", "revoke", new["key_id"], "--json"]).stdout)
    assert again["revoked"] is True and again["revoked_now"] is False
    assert KeyStore(db).verify(new["key"]) is None


def test_cli_revoke_says_what_it_did(db: BlobStore) -> None:
    key_id = KeyStore(db).create("acme").key_id
    first = runner.invoke(app, ["api", "keys", "revoke", key_id])
    assert first.exit_code == 0 and "revoked" in first.stdout and "already" not in first.stdout
    second = runner.invoke(app, ["api", "keys", "revoke", key_id])
    assert second.exit_code == 0 and "already revoked" in second.stdout


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["revoke", "0123456789abcdef"], "no API key"),
        (["revoke", "not-an-id"], "no API key"),
        (["create", "--tenant", "a b"], "tenant"),
        (["list", "--tenant", "a b", "--json"], "tenant"),
        (["create", "--tenant", "acme", "--label", "a\nb"], "label"),
    ],
)
def test_cli_wrong_use_exits_2_with_a_reason(db: BlobStore, argv: list[str], says: str) -> None:
    done = runner.invoke(app, ["api", "keys", *argv])
    assert done.exit_code == 2, done.output
    assert says in done.stderr and done.stdout == ""


def test_cli_create_needs_a_tenant(db: BlobStore) -> None:
    done = runner.invoke(app, ["api", "keys", "create"])
    assert done.exit_code == 2 and "--tenant" in done.output


def test_a_watching_replica_learns_revocations_from_one_listing(tmp_path: Path) -> None:
    """A server's store reads nothing per request for a key it has seen: its watch lists the key
    area every refresh and marks what was revoked since."""
    blobs = BlobStore(str(tmp_path / "blobs"))
    now = [100.0]
    replica = KeyStore(blobs, refresh_s=1.0, monotonic=lambda: now[0])
    replica._watching.set()  # as `watch` does, without its thread: refresh_revocations is called here
    kept, gone = KeyStore(blobs).create("acme"), KeyStore(blobs).create("acme")
    assert replica.verify(kept.key) is not None and replica.verify(gone.key) is not None
    assert KeyStore(blobs).revoke(gone.key_id)
    now[0] += 60  # long past the refresh: still no read on the request's path
    assert replica.verify(gone.key) is not None
    assert replica.refresh_revocations() == 1
    assert replica.verify(gone.key) is None and replica.verify(kept.key) is not None


def test_the_watch_thread_marks_a_revocation_within_the_refresh(tmp_path: Path) -> None:
    blobs = BlobStore(str(tmp_path / "blobs"))
    replica = KeyStore(blobs, refresh_s=0.2).watch()
    try:
        created = KeyStore(blobs).create("acme")
        assert replica.verify(created.key) is not None
        KeyStore(blobs).revoke(created.key_id)
        deadline = time.monotonic() + 2.0
        while replica.verify(created.key) is not None:
            assert time.monotonic() < deadline, "the watch never marked the revocation"
            time.sleep(0.05)
    finally:
        replica.close()
