"""The TLS helpers beneath ``bolt up --tls``, ``--ca`` and ``BOLT_CA``: what the certificates
``make_certificates`` writes say about themselves (names, uses, validity, who signed them),
when an existing CA is kept and when it is replaced, and the clear errors for a CA bundle that
cannot be used."""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from boltforge.agent.client import ServerClient
from boltforge.client import Client
from boltforge.tls import (
    CA_DAYS,
    SERVER_DAYS,
    SKEW,
    BadCA,
    Certificates,
    certificate_problem,
    client_context,
    make_certificates,
    verify_with,
)


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def alt_names(cert: x509.Certificate) -> x509.SubjectAlternativeName:
    return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value


def common_name(cert: x509.Certificate) -> str:
    return str(cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


def uses(cert: x509.Certificate) -> set[str]:
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage)
    assert usage.critical
    names = ("digital_signature", "key_encipherment", "key_cert_sign", "crl_sign")
    return {n for n in names if getattr(usage.value, n)}


def write_ca(
    folder: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey, valid_for: dt.timedelta
) -> bytes:
    """A self-signed CA of our own in ``folder`` (ca.pem, ca.key) valid for ``valid_for``
    more; the certificate's PEM."""
    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "old CA")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=100))
        .not_valid_after(now + valid_for)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    (folder / "ca.pem").write_bytes(pem)
    (folder / "ca.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return pem


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    folder = tmp_path_factory.mktemp("tls") / "certs"
    return make_certificates(folder, ["bolt.example.com", "10.0.0.7", "::1", "localhost"])


# --- what the certificates say ----------------------------------------------------------------


def test_the_server_certificate_names_each_host_as_an_address_or_a_dns_name(
    certs: Certificates,
) -> None:
    server = load(certs.cert)
    names = alt_names(server)
    assert names.get_values_for_type(x509.DNSName) == ["bolt.example.com", "localhost"]
    assert names.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("10.0.0.7"),
        ipaddress.ip_address("::1"),
    ]
    assert common_name(server) == "bolt.example.com"  # the first host


def test_the_ca_can_sign_certificates_and_nothing_else(certs: Certificates) -> None:
    ca = load(certs.ca)
    constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca and constraints.value.path_length == 0
    assert uses(ca) == {"key_cert_sign", "crl_sign"}
    assert ca.issuer == ca.subject and common_name(ca) == "Boltforge local CA"
    ca.verify_directly_issued_by(ca)  # self-signed


def test_the_server_certificate_is_signed_by_the_ca_for_server_use_only(
    certs: Certificates,
) -> None:
    ca, server = load(certs.ca), load(certs.cert)
    server.verify_directly_issued_by(ca)
    assert not server.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert uses(server) == {"digital_signature"}
    purposes = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(purposes) == [ExtendedKeyUsageOID.SERVER_AUTH]
    ca_id = ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest
    by = server.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    assert by.key_identifier == ca_id


def test_the_server_key_is_the_one_the_certificate_carries(certs: Certificates) -> None:
    key = serialization.load_pem_private_key(certs.key.read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    public = load(certs.cert).public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey)
    assert key.public_key().public_numbers() == public.public_numbers()


@pytest.mark.parametrize(("which", "days"), [("ca", CA_DAYS), ("cert", SERVER_DAYS)])
def test_certificates_are_valid_from_a_little_before_they_were_made(
    certs: Certificates, which: str, days: int
) -> None:
    cert = load(getattr(certs, which))
    now = dt.datetime.now(dt.UTC)
    assert cert.not_valid_before_utc <= now - SKEW + dt.timedelta(minutes=1)
    assert cert.not_valid_before_utc >= now - SKEW - dt.timedelta(hours=1)
    assert cert.not_valid_after_utc - cert.not_valid_before_utc == dt.timedelta(days=days) + SKEW


def test_the_server_certificate_is_no_longer_lived_than_browsers_accept(
    certs: Certificates,
) -> None:
    server = load(certs.cert)
    assert server.not_valid_after_utc - server.not_valid_before_utc <= dt.timedelta(days=398)


# --- keeping or replacing the CA --------------------------------------------------------------


def test_a_ca_that_expires_within_a_day_is_replaced(tmp_path: Path) -> None:
    old = write_ca(tmp_path, ec.generate_private_key(ec.SECP256R1()), dt.timedelta(hours=12))
    made = make_certificates(tmp_path)
    assert made.ca.read_bytes() != old
    load(made.cert).verify_directly_issued_by(load(made.ca))


def test_a_ca_that_holds_for_longer_is_kept_and_signs_the_new_certificate(tmp_path: Path) -> None:
    old = write_ca(tmp_path, ec.generate_private_key(ec.SECP256R1()), dt.timedelta(days=3))
    made = make_certificates(tmp_path, ["127.0.0.1"])
    assert made.ca.read_bytes() == old
    load(made.cert).verify_directly_issued_by(load(made.ca))
    assert common_name(load(made.ca)) == "old CA"


def test_a_ca_whose_key_is_not_an_ec_key_is_replaced(tmp_path: Path) -> None:
    old = write_ca(tmp_path, rsa.generate_private_key(65537, 1024), dt.timedelta(days=300))
    made = make_certificates(tmp_path)
    assert made.ca.read_bytes() != old
    assert isinstance(load(made.ca).public_key(), ec.EllipticCurvePublicKey)


def test_a_ca_file_that_does_not_parse_is_replaced(tmp_path: Path) -> None:
    tmp_path.joinpath("ca.pem").write_text("not a certificate")
    tmp_path.joinpath("ca.key").write_text("not a key")
    made = make_certificates(tmp_path)
    load(made.cert).verify_directly_issued_by(load(made.ca))
    assert stat.S_IMODE((tmp_path / "ca.key").stat().st_mode) == 0o600


def test_a_key_left_readable_by_others_is_made_private_when_rewritten(tmp_path: Path) -> None:
    tmp_path.joinpath("server.key").write_text("old")
    tmp_path.joinpath("server.key").chmod(0o644)
    made = make_certificates(tmp_path)
    assert stat.S_IMODE(made.key.stat().st_mode) == 0o600
    assert stat.S_IMODE(made.cert.stat().st_mode) == 0o644
    assert b"BEGIN PRIVATE KEY" in made.key.read_bytes()


def test_a_missing_folder_is_made_with_its_parents(tmp_path: Path) -> None:
    made = make_certificates(tmp_path / "a" / "b" / "tls")
    assert made.ca.parent == tmp_path / "a" / "b" / "tls"
    assert stat.S_IMODE(made.ca.parent.stat().st_mode) == 0o700


# --- what a client verifies the server with ---------------------------------------------------


@pytest.mark.parametrize("ca", [None, ""])
def test_without_a_ca_the_system_store_is_used(ca: str | None) -> None:
    assert verify_with(ca) is True


def test_with_a_ca_only_it_is_trusted_and_host_names_are_checked(certs: Certificates) -> None:
    context = verify_with(certs.ca)
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    [trusted] = context.get_ca_certs()
    assert (("commonName", "Boltforge local CA"),) in trusted["subject"]


def test_a_ca_file_that_is_not_there_is_named_with_the_reason(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "ca.pem"
    with pytest.raises(BadCA) as e:
        client_context(missing)
    assert str(e.value) == f"{missing}: No such file or directory"
    assert isinstance(e.value, ValueError)  # callers that catch ValueError see it too


def test_a_folder_given_as_the_ca_is_named_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(BadCA, match=r": Is a directory$"):
        client_context(tmp_path)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("-----BEGIN CERTIFICATE-----\nabc\n-----END CERTIFICATE-----\n", id="bad"),
        pytest.param("hello\n", id="not PEM"),
    ],
)
def test_a_file_without_a_pem_certificate_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "ca.pem"
    path.write_text(text)
    with pytest.raises(BadCA, match=rf"^{path}: no PEM CA certificate in it \("):
        client_context(path)


def test_a_private_key_given_as_the_ca_is_refused(certs: Certificates) -> None:
    with pytest.raises(BadCA, match="no PEM CA certificate"):
        client_context(certs.key)


def test_both_clients_refuse_a_ca_they_cannot_load_when_made(tmp_path: Path) -> None:
    missing = tmp_path / "ca.pem"
    with pytest.raises(BadCA, match="No such file"):
        Client("https://127.0.0.1:1", "tok", ca=missing)
    with pytest.raises(BadCA, match="No such file"):
        ServerClient("https://127.0.0.1:1", "tok", ca=missing)


# --- why a certificate did not verify -------------------------------------------------------


def verification_error(message: str | None, reason: str | None = None) -> ssl.SSLError:
    """A verification error as the ssl module raises it (with its message and reason)."""
    error = ssl.SSLCertVerificationError(1, "certificate verify failed")
    error.verify_message = message  # type: ignore[assignment]
    error.reason = reason  # type: ignore[assignment]
    return error


def test_the_verification_error_itself_says_why() -> None:
    assert certificate_problem(verification_error("certificate has expired")) == (
        "certificate has expired"
    )
    assert certificate_problem(verification_error(None, "CERTIFICATE_VERIFY_FAILED")) == (
        "CERTIFICATE_VERIFY_FAILED"
    )


def test_the_cause_is_found_through_the_context_too() -> None:
    try:
        try:
            raise verification_error("hostname mismatch")
        except ssl.SSLError:
            raise OSError("connect failed")  # noqa: B904 - chained implicitly on purpose
    except OSError as outer:
        assert outer.__cause__ is None
        assert certificate_problem(outer) == "hostname mismatch"


def test_a_cycle_of_causes_ends_with_no_answer() -> None:
    first, second = RuntimeError("a"), RuntimeError("b")
    first.__cause__, second.__cause__ = second, first
    assert certificate_problem(first) is None
