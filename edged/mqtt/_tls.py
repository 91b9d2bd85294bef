"""The client TLS context for the broker, from ``[mqtt] ca_file``, ``cert_file`` and ``key_file``.

Built here rather than by paho's ``tls_set`` (the context is the same: TLS client, certificate and host name
checked) so that every failure names the key and the file: paho's error named neither key nor, for a missing key,
the right file, and with an encrypted key OpenSSL asked for a pass phrase on the terminal, which blocks a daemon
started from one and fails with "Invalid argument" under systemd. edged has no setting for a key's pass phrase.
"""

from __future__ import annotations

import ssl

from edged.errors import ConfigKeyError
from edged.mqtt._settings import ConnectionSettings

_READABLE = "readable by edged's user"


class _EncryptedKey(Exception):
    """Raised by the pass-phrase callback, which OpenSSL calls only for an encrypted key."""


def _no_pass_phrase() -> bytes:
    raise _EncryptedKey


def tls_context(settings: ConnectionSettings) -> ssl.SSLContext:
    """The context for ``settings`` (``tls`` set); a `ConfigKeyError` naming the key and the file on failure."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.verify_mode = ssl.CERT_REQUIRED
    if settings.ca_file is not None:
        _read("mqtt.ca_file", settings.ca_file)
        try:
            context.load_verify_locations(settings.ca_file)
        except (ssl.SSLError, OSError) as e:
            raise ConfigKeyError("mqtt.ca_file", f"{settings.ca_file} holds no CA certificate edged can use "
                                 f"({_reason(e)}); point ca_file at the broker's CA certificate in PEM") from e
    else:
        context.load_default_certs()
    if settings.cert_file is not None:
        _load_client_certificate(context, settings.cert_file, settings.key_file)
    elif settings.key_file is not None:  # paho ignored it: the connection went out without a client certificate
        raise ConfigKeyError("mqtt.key_file", f"{settings.key_file} is set without cert_file, and a private key "
                             "alone cannot authenticate: set cert_file to the client certificate, or remove key_file")
    return context


def _load_client_certificate(context: ssl.SSLContext, cert_file: str, key_file: str | None) -> None:
    certificate = _read("mqtt.cert_file", cert_file)
    # without key_file the key is read from cert_file, as OpenSSL does
    key_key, key_path = ("mqtt.key_file", key_file) if key_file is not None else ("mqtt.cert_file", cert_file)
    key = _read(key_key, key_path) if key_file is not None else certificate
    try:
        context.load_cert_chain(cert_file, key_file, password=_no_pass_phrase)
    except _EncryptedKey:
        raise ConfigKeyError(key_key, f"{key_path} holds an encrypted private key, and edged has no way to take "
                             "its pass phrase: store the key decrypted (openssl pkey -in KEY -out PLAIN_KEY), "
                             f"{_READABLE} only") from None
    except (ssl.SSLError, OSError) as e:
        if b"-----BEGIN CERTIFICATE-----" not in certificate:
            raise ConfigKeyError("mqtt.cert_file", f"{cert_file} holds no PEM certificate; point cert_file at "
                                 "the client certificate in PEM") from e
        if b"PRIVATE KEY-----" not in key:
            raise ConfigKeyError(key_key, f"{key_path} holds no PEM private key; point key_file at the client "
                                 "certificate's private key in PEM") from e
        if getattr(e, "reason", None) == "KEY_VALUES_MISMATCH":
            raise ConfigKeyError(key_key, f"{key_path} is not the private key of the certificate in cert_file "
                                 f"{cert_file}; point key_file at that certificate's key") from e
        raise ConfigKeyError(key_key, f"cannot use {key_path} as the key of the certificate {cert_file} "
                             f"({_reason(e)})") from e


def _read(key: str, path: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as e:
        raise ConfigKeyError(key, f"cannot read {path}: {e.strerror}; the file must exist and be {_READABLE}") \
            from e


def _reason(error: Exception) -> str:
    return str(getattr(error, "reason", None) or getattr(error, "strerror", None) or error)
