"""``[server.tcp_restricted]``: Triton's ``--http-restricted-api`` for edged's loopback TCP listener.

Each key is one of Triton's API categories, each value ``"HEADER=VALUE"``: over TCP, a request of that
category is served only when it carries that header with that value. The table is checked when the config is
read; errors name the key but never echo the value, which is a secret.
"""

from __future__ import annotations

import re

from edged.errors import ConfigError

# Triton's categories, in its order. The last two have no served routes in edged (their routes only say the
# feature is absent): a key for one would do nothing.
TCP_CATEGORIES = ("health", "metadata", "inference", "shared-memory", "model-config", "model-repository",
                  "statistics", "trace", "logging")
UNSERVED_CATEGORIES = frozenset({"trace", "logging"})
# Headers edged itself interprets, or that proxies rewrite: a key there would be ambiguous.
_RESERVED_HEADERS = frozenset({"content-length", "content-type", "expect", "inference-header-content-length",
                               "host", "transfer-encoding", "connection", "upgrade"})
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP header name (RFC 9110 token)
_VALUE = re.compile(r"[!-~]+")  # visible ASCII, no spaces: parsers strip and fold whitespace differently


def parse_restriction(category: str, text: str) -> tuple[str, str]:
    """``"HEADER=VALUE"`` as (lower-case header name, value); ConfigError naming the key otherwise."""
    where = f"server.tcp_restricted.{category}"
    name, sep, value = text.partition("=")
    if not sep or not _TOKEN.fullmatch(name) or not _VALUE.fullmatch(value):
        raise ConfigError(f'{where}: expected "HEADER=VALUE" (a header name, "=", then visible ASCII '
                          "characters without spaces); the value given does not have that form")
    if name.lower() in _RESERVED_HEADERS:
        raise ConfigError(f"{where}: header {name!r} is one edged or HTTP itself interprets; choose another "
                          "name, such as edged-key")
    return name.lower(), value


def check_tcp_restricted(table: dict[str, str]) -> None:
    """Raise (rather than return a problem) so that the loader's message does not quote the secret values."""
    for category, text in table.items():
        if category not in TCP_CATEGORIES:
            raise ConfigError(f"unknown key server.tcp_restricted.{category}: expected one of Triton's API "
                              f"categories ({', '.join(TCP_CATEGORIES)})")
        if category in UNSERVED_CATEGORIES:
            raise ConfigError(f"server.tcp_restricted.{category}: edged serves no {category} routes, so this "
                              "key would restrict nothing; remove it")
        parse_restriction(category, text)
