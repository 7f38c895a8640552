"""API keys: their format, and the secret they are stored under.

A key made by `chatpipe keys create` reads `cp-<key_id>-<secret>`: `key_id` (12 hex
digits) is public — `chatpipe keys list` shows it, `chatpipe keys revoke KEY_ID`
takes it — and `secret` is 43 random URL-safe characters (256 bits). The key itself
is never stored: the store keeps its HMAC-SHA256 under the deployment's key secret
(`CHATPIPE_KEY_SECRET`, `conversations.store.hash_api_key`) with the key_id, owner,
tier, name, expiry and revocation.

Where the key secret comes from:

* `CHATPIPE_KEY_SECRET`, wherever it is set;
* `chatpipe up` with a SQLite store and no CHATPIPE_KEY_SECRET (development): a
  secret it generates once and keeps beside the database (`<database>.key-secret`,
  mode 0600), read again on every start so keys keep opening across restarts;
* `chatpipe keys …` on a SQLite store without CHATPIPE_KEY_SECRET: that file, if
  `chatpipe up` made one (it never makes one);
* anything else that checks keys — a gateway run alone (`chatpipe gateway`), or
  `chatpipe up` on Cassandra — refuses to start without CHATPIPE_KEY_SECRET.

Changing the secret invalidates every key (no hash matches any more).
"""

from __future__ import annotations

import os
import secrets
from datetime import UTC, datetime
from pathlib import Path

from pydantic import SecretStr

from chatpipe.settings import Settings

KEY_ID_BYTES = 6  # 12 hex digits
SECRET_FILE_SUFFIX = ".key-secret"
NO_SECRET = (
    "set CHATPIPE_KEY_SECRET: the HMAC secret API keys are stored under (e.g. `python -c "
    "'import secrets; print(secrets.token_urlsafe(32))'`); every process that creates or "
    "checks keys needs the same one"
)


def new_key() -> tuple[str, str]:
    """A new key's (key_id, key): `cp-<key_id>-<secret>`."""
    key_id = secrets.token_hex(KEY_ID_BYTES)
    return key_id, f"cp-{key_id}-{secrets.token_urlsafe(32)}"


def key_secret(settings: Settings) -> bytes | None:
    """CHATPIPE_KEY_SECRET as bytes; None when unset or empty."""
    if settings.gateway.key_secret is None or not settings.gateway.key_secret.get_secret_value():
        return None
    return settings.gateway.key_secret.get_secret_value().encode()


def secret_file(database_path: Path) -> Path:
    """Where `chatpipe up` keeps its generated key secret: beside the SQLite file."""
    return database_path.with_name(database_path.name + SECRET_FILE_SUFFIX)


def development_settings(settings: Settings) -> Settings:
    """`chatpipe up`'s settings, with the key secret it runs under: CHATPIPE_KEY_SECRET,
    else (SQLite) the one kept beside the database, made on first start. On Cassandra
    without CHATPIPE_KEY_SECRET it refuses to start (SystemExit)."""
    if key_secret(settings) is not None:
        return settings
    if settings.storage.store == "cassandra":
        raise SystemExit(f"chatpipe up with store=cassandra: {NO_SECRET}")
    secret = development_secret(settings.storage.database_path)
    return settings.replace(**{"key_secret": SecretStr(secret.decode())})


def require_key_secret(settings: Settings, who: str) -> None:
    """SystemExit, saying what to set, unless CHATPIPE_KEY_SECRET is set."""
    if key_secret(settings) is None:
        raise SystemExit(f"{who}: {NO_SECRET}")


def cli_settings(settings: Settings) -> Settings:
    """`chatpipe keys …`: CHATPIPE_KEY_SECRET, else the secret `chatpipe up` keeps beside
    its SQLite database, if it has made one; else the settings as they are (listing and
    revoking keys need no secret)."""
    if key_secret(settings) is not None or settings.storage.store != "sqlite":
        return settings
    path = secret_file(settings.storage.database_path)
    if not path.exists():
        return settings
    return settings.replace(**{"key_secret": SecretStr(_read_secret(path).decode())})


def development_secret(database_path: Path) -> bytes:
    """The secret kept in `secret_file(database_path)`: read it, or make it (random,
    mode 0600; of two processes making it at once, the first one's is kept). An
    in-memory database gets a secret of its own, as short-lived as its keys."""
    if str(database_path) == ":memory:":
        return secrets.token_urlsafe(32).encode()
    path = secret_file(database_path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        draft = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(32) + "\n")
        try:
            os.link(draft, path)  # whole or not at all; never replaces one already there
        except FileExistsError:
            pass
        finally:
            draft.unlink()
    return _read_secret(path)


def _read_secret(path: Path) -> bytes:
    secret = path.read_text().strip()
    if not secret:
        raise SystemExit(f"{path} is empty: delete it (every key made under it stops "
                         "opening) or write the key secret into it")  # fmt: skip
    return secret.encode()


def iso_time(epoch_s: float | None) -> str | None:
    """`2025-06-01T12:00:00Z` (UTC, whole seconds); None stays None."""
    if epoch_s is None:
        return None
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
