"""TLS between the ``bolt`` commands, the agents and the server: the SSL context a client
verifies the server with, what to tell the user when that verification fails, and a local
certificate authority with a server certificate for ``bolt up --tls``."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT, CA_KEY = "ca.pem", "ca.key"
SERVER_CERT, SERVER_KEY = "server.pem", "server.key"
LOCAL_HOSTS = ("127.0.0.1", "localhost")
CA_DAYS = 3650
SERVER_DAYS = 397  # the longest validity browsers accept for a server certificate
SKEW = dt.timedelta(minutes=5)  # certificates are valid from a little before they are made
KEY_USES = (
    "digital_signature",
    "content_commitment",
    "key_encipherment",
    "data_encipherment",
    "key_agreement",
    "key_cert_sign",
    "crl_sign",
    "encipher_only",
    "decipher_only",
)


class BadCA(ValueError):
    """A CA bundle that cannot be used: missing, unreadable, or with no PEM certificate."""


def client_context(ca: str | Path) -> ssl.SSLContext:
    """A client context that trusts only the CA certificates in the PEM file ``ca`` and checks
    the server's host name against its certificate. Raises ``BadCA`` naming the file and the
    reason when it cannot be loaded."""
    try:
        return ssl.create_default_context(cafile=str(ca))
    except ssl.SSLError as e:
        raise BadCA(f"{ca}: no PEM CA certificate in it ({e.reason or e})") from None
    except OSError as e:
        raise BadCA(f"{ca}: {e.strerror or e}") from None


def verify_with(ca: str | Path | None) -> ssl.SSLContext | bool:
    """What an httpx client verifies an https server with: ``client_context(ca)``, or True
    (the system's trusted CAs, httpx's default) without ``ca``. Plain http is not affected."""
    return client_context(ca) if ca else True


def certificate_problem(error: BaseException) -> str | None:
    """Why the server's certificate did not verify, when that is what ``error`` is or was
    raised from (e.g. ``self-signed certificate in certificate chain``); else None."""
    seen: BaseException | None = error
    for _ in range(16):  # a chain of causes is short; a cyclic one must not loop forever
        if seen is None:
            return None
        if isinstance(seen, ssl.SSLCertVerificationError):
            return str(seen.verify_message or seen.reason or seen)
        seen = seen.__cause__ or seen.__context__
    return None


@dataclass(frozen=True, slots=True)
class Certificates:
    """The files ``make_certificates`` wrote (PEM): the CA certificate clients trust, and
    the server's certificate (signed by that CA) and private key."""

    ca: Path
    cert: Path
    key: Path


def make_certificates(directory: Path, hosts: Sequence[str] = LOCAL_HOSTS) -> Certificates:
    """Write a server certificate for ``hosts`` (IP addresses or DNS names; at least one)
    into ``directory`` as server.pem, with its private key in server.key, signed by the CA
    in ca.pem (its key in ca.key), and return the paths of ca.pem, server.pem and server.key.

    A CA already in ``directory`` (ca.pem and ca.key load, and it is valid for at least
    another day) is reused, so clients that trust it also trust the new server certificate;
    otherwise a new CA is made there. A new server certificate and key are made on every
    call. Keys are readable by their owner only (0600); ``directory`` is made (0700) when
    missing."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca_cert, ca_key = _load_ca(directory) or new_ca(directory)
    cert, key = _issue(ca_cert, ca_key, hosts)
    paths = Certificates(directory / CA_CERT, directory / SERVER_CERT, directory / SERVER_KEY)
    _write(paths.key, key_pem(key), 0o600)
    _write(paths.cert, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return paths


def _load_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None:
    """The CA in ``directory`` when both of its files load, its key is an EC key and its
    certificate is valid for at least another day; else None."""
    try:
        cert = x509.load_pem_x509_certificate((directory / CA_CERT).read_bytes())
        key = serialization.load_pem_private_key((directory / CA_KEY).read_bytes(), None)
    except (OSError, ValueError, TypeError):
        return None
    fresh = cert.not_valid_after_utc > _now() + dt.timedelta(days=1)
    return (cert, key) if fresh and isinstance(key, ec.EllipticCurvePrivateKey) else None


def new_ca(
    directory: Path, common_name: str = "Boltforge local CA"
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A new self-signed CA named ``common_name``, written to ca.pem and ca.key (0600) in
    ``directory``."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(common_name)
    cert = (
        _builder(name, name, key.public_key(), CA_DAYS)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage("key_cert_sign", "crl_sign"), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    _write(directory / CA_KEY, key_pem(key), 0o600)
    _write(directory / CA_CERT, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return cert, key


def _issue(
    ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, hosts: Sequence[str]
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A new key and a server certificate for ``hosts``, signed by the CA."""
    return issue(ca, ca_key, _name(hosts[0]), ExtendedKeyUsageOID.SERVER_AUTH, hosts)


def issue(
    ca: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    hosts: Sequence[str] = (),
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A new key and a certificate for ``subject`` signed by the CA, for one extended
    ``usage`` (server or client authentication), naming ``hosts`` (IP addresses or DNS names)
    as its subject alternative names when there are any."""
    key = ec.generate_private_key(ec.SECP256R1())
    ca_id = ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    builder = (
        _builder(subject, ca.subject, key.public_key(), SERVER_DAYS)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage("digital_signature"), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_id), False)
    )
    if hosts:
        names = x509.SubjectAlternativeName([_general_name(h) for h in hosts])
        builder = builder.add_extension(names, False)
    return builder.sign(ca_key, hashes.SHA256()), key


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, days: int
) -> x509.CertificateBuilder:
    """A certificate with its names, public key, serial number and validity filled in."""
    now = _now()
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - SKEW)
        .not_valid_after(now + dt.timedelta(days=days))
    )


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _usage(*allowed: str) -> x509.KeyUsage:
    """A key usage extension that allows only the ``allowed`` uses."""
    return x509.KeyUsage(**{use: use in allowed for use in KEY_USES})


def _general_name(host: str) -> x509.GeneralName:
    """``host`` as a subject alternative name: an IP address, or else a DNS name."""
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` with permissions ``mode``, also when it already exists."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, mode)
