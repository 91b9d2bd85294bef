"""Ed25519 key files of a fleet repository (unencrypted PKCS#8 PEM, mode 0600) and their TUF signers."""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from securesystemslib.signer._crypto_signer import CryptoSigner
from securesystemslib.signer._key import SSlibKey

from edged.errors import UpdateRejected


def generate_key(path: Path) -> CryptoSigner:
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    return signer_for(private)


def load_signer(path: Path) -> CryptoSigner:
    try:
        private = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError) as e:
        raise UpdateRejected(f"key file {path}: cannot read an ed25519 private key: {e}") from e
    if not isinstance(private, Ed25519PrivateKey):
        raise UpdateRejected(f"key file {path}: expected an ed25519 key, found {type(private).__name__}")
    return signer_for(private)


def signer_for(private: Ed25519PrivateKey) -> CryptoSigner:
    public = SSlibKey.from_crypto(private.public_key())
    return CryptoSigner(private, public)
