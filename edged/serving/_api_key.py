"""``[server] openai_api_key`` / ``openai_api_key_file``: the Bearer key the OpenAI routes (``/v1``) require
over loopback TCP.

Without a key those routes are open on loopback TCP, as everything else there is (OpenAI's clients send a
key anyway, which is then ignored). With one, a /v1 request over TCP without ``Authorization: Bearer <key>``
gets 401 in OpenAI's error shape; the comparison takes the same time however much of the key matches. The
Unix socket needs no key: its file mode, group and ``[server.access]`` decide who may connect. The key file
is read once, when the server is built; a missing, unreadable or empty file is a ConfigError then, not a 401
later.
"""

from __future__ import annotations

import hmac
import logging
import stat
from collections.abc import Mapping
from pathlib import Path

from edged.config import ServerConfig
from edged.errors import ConfigKeyError
from edged.serving._openai import Unauthenticated

log = logging.getLogger(__name__)

HEADER = b"authorization"
API_ACTION = "use the OpenAI API"  # what a request without the key is counted as denied to do
_MIN_LENGTH = 16
KEY_FILE = "server.openai_api_key_file"


class ApiKey:
    def __init__(self, key: str) -> None:
        self._expected = b"bearer " + key.encode()

    def check(self, headers: Mapping[bytes, bytes]) -> None:
        sent = headers.get(HEADER, b"")
        # the scheme is case-insensitive (RFC 9110); lowercase only it, so the key keeps its case
        candidate = sent[:7].lower() + sent[7:]
        if not hmac.compare_digest(candidate, self._expected):
            what = "no Authorization header" if not sent else "a wrong key"
            raise Unauthenticated(f"this listener requires an API key (server.openai_api_key): the request "
                                  f"carried {what}; send \"Authorization: Bearer <key>\"")


def api_key_for(config: ServerConfig) -> ApiKey | None:
    if config.openai_api_key is not None:
        return ApiKey(config.openai_api_key)
    if config.openai_api_key_file is None:
        return None
    path = Path(config.openai_api_key_file)
    try:
        raw = path.read_bytes()
        mode = path.stat().st_mode
    except OSError as e:
        raise ConfigKeyError(KEY_FILE, f"cannot read {path}: {e.strerror}; the file must be readable by edged's "
                             "user") from e
    bad_byte = None
    try:
        key = raw.decode("utf-8").split("\n", 1)[0].strip()
    except UnicodeDecodeError as e:
        bad_byte = e.start
    if bad_byte is not None:  # raised outside the handler: the decode error holds the file's bytes, the key too
        raise ConfigKeyError(KEY_FILE, f"{path} is not UTF-8 text (byte {bad_byte}); save the key as UTF-8")
    if len(key) < _MIN_LENGTH:
        raise ConfigKeyError(KEY_FILE, f"the key on the first line of {path} must be at least {_MIN_LENGTH} "
                             f"characters, found {len(key)}")
    if mode & (stat.S_IROTH | stat.S_IWOTH):
        log.warning("server.openai_api_key_file %s is readable by every user (mode %o); chmod o-rw it", path,
                    stat.S_IMODE(mode))
    return ApiKey(key)
