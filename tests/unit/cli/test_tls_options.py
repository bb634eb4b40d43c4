"""TLS for the control plane without a network: the local CA and server certificate that
``bolt up --tls`` makes (checked with a real handshake in memory), how ``bolt server``
refuses bad certificate options, and where the ``bolt`` commands and ``bolt agent`` find
the CA they verify the server with."""

from __future__ import annotations

import json
import ssl
import stat
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

import boltforge.cli.remote as remote
from boltforge.cli.main import app
from boltforge.client import config_path, resolve_ca
from boltforge.tls import BadCA, Certificates, certificate_problem, make_certificates
from boltforge.wire.jobs import NodeList

runner = CliRunner()
SAVED = "https://127.0.0.1:8600"


def bolt(*args: str | Path) -> Result:
    return runner.invoke(app, [str(a) for a in args])


def refused(result: Result, *named: str) -> str:
    """The output of a command that exited 2 with one clean error naming each of ``named``."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert all(n in result.output for n in named), result.output
    assert "To fix" in result.output, result.output
    return result.output


def handshake(certs: Certificates, trusted_ca: Path, host: str) -> dict[str, Any]:
    """A TLS handshake in memory between a server with ``certs`` and a client that trusts
    ``trusted_ca`` and connects to ``host`` (strict X.509 checks, as newer Pythons do by
    default); the server certificate the client accepted."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(certs.cert, certs.key)
    client = ssl.create_default_context(cafile=str(trusted_ca))
    client.verify_flags |= ssl.VERIFY_X509_STRICT
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    c = client.wrap_bio(to_client, to_server, server_hostname=host)
    s = server.wrap_bio(to_server, to_client, server_side=True)
    done: set[ssl.SSLObject] = set()
    for _ in range(10):
        for side in (c, s):
            try:
                side.do_handshake()
                done.add(side)
            except ssl.SSLWantReadError:
                pass
        if done == {c, s}:
            return c.getpeercert() or {}
    raise AssertionError("the handshake did not finish")


@pytest.fixture
def certs(tmp_path: Path) -> Certificates:
    return make_certificates(tmp_path / "tls")


# --- the local CA and the server certificate ------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_the_local_ca_verifies_the_server_certificate_for_each_local_name(
    certs: Certificates, host: str
) -> None:
    accepted = handshake(certs, certs.ca, host)
    assert ("IP Address", "127.0.0.1") in accepted["subjectAltName"]
    assert ("DNS", "localhost") in accepted["subjectAltName"]


def test_the_certificate_names_no_other_host(certs: Certificates) -> None:
    with pytest.raises(ssl.SSLCertVerificationError) as e:
        handshake(certs, certs.ca, "bolt.example.com")
    assert "bolt.example.com" in str(certificate_problem(e.value))


def test_a_client_that_trusts_another_ca_rejects_the_certificate(
    certs: Certificates, tmp_path: Path
) -> None:
    other = make_certificates(tmp_path / "other")
    with pytest.raises(ssl.SSLCertVerificationError) as e:
        handshake(certs, other.ca, "127.0.0.1")
    assert "certificate" in str(certificate_problem(e.value))


def test_the_files_are_where_the_paths_say(certs: Certificates, tmp_path: Path) -> None:
    folder = tmp_path / "tls"
    assert certs == Certificates(folder / "ca.pem", folder / "server.pem", folder / "server.key")
    assert b"BEGIN CERTIFICATE" in certs.ca.read_bytes()
    assert b"BEGIN CERTIFICATE" in certs.cert.read_bytes()
    assert b"BEGIN PRIVATE KEY" in certs.key.read_bytes()


def test_keys_are_readable_by_their_owner_only(certs: Certificates) -> None:
    folder = certs.ca.parent
    for key in (certs.key, folder / "ca.key"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_an_existing_ca_is_reused_to_sign_a_new_server_certificate(certs: Certificates) -> None:
    ca, cert = certs.ca.read_bytes(), certs.cert.read_bytes()
    again = make_certificates(certs.ca.parent)
    assert again == certs
    assert again.ca.read_bytes() == ca, "clients that trust the CA keep trusting the server"
    assert again.cert.read_bytes() != cert
    handshake(again, again.ca, "127.0.0.1")


def test_a_ca_whose_key_is_gone_is_replaced(certs: Certificates) -> None:
    ca = certs.ca.read_bytes()
    (certs.ca.parent / "ca.key").unlink()
    again = make_certificates(certs.ca.parent)
    assert again.ca.read_bytes() != ca
    handshake(again, again.ca, "localhost")


def test_certificate_problem_finds_the_verification_error_among_the_causes() -> None:
    cause = ssl.SSLCertVerificationError(1, "certificate verify failed")
    cause.verify_message = "self-signed certificate in certificate chain"
    try:
        try:
            raise cause
        except ssl.SSLError as e:
            raise ConnectionError("connect failed") from e
    except ConnectionError as outer:
        assert certificate_problem(outer) == "self-signed certificate in certificate chain"
    assert certificate_problem(ConnectionError("refused")) is None


# --- bolt server --tls-cert / --tls-key ----------------------------------------------------


@pytest.fixture
def server_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Nothing a refused `bolt server` might write reaches the user's data directory."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("BOLT_ADMIN_TOKEN", raising=False)


def test_a_certificate_without_its_key_is_refused(server_env: None, certs: Certificates) -> None:
    refused(bolt("server", "--tls-cert", certs.cert), "--tls-cert needs --tls-key")


def test_a_key_without_its_certificate_is_refused(server_env: None, certs: Certificates) -> None:
    refused(bolt("server", "--tls-key", certs.key), "--tls-key needs --tls-cert")


def test_a_missing_certificate_file_is_refused(
    server_env: None, certs: Certificates, tmp_path: Path
) -> None:
    missing = tmp_path / "nope.pem"
    out = refused(bolt("server", "--tls-cert", missing, "--tls-key", certs.key), "--tls-cert")
    assert "no such file" in out


def test_the_key_of_another_certificate_is_refused(
    server_env: None, certs: Certificates, tmp_path: Path
) -> None:
    other = make_certificates(tmp_path / "other")
    out = refused(bolt("server", "--tls-cert", certs.cert, "--tls-key", other.key), "--tls-key")
    assert "is not the key of --tls-cert" in out


def test_a_key_given_as_the_certificate_is_refused(server_env: None, certs: Certificates) -> None:
    out = refused(bolt("server", "--tls-cert", certs.key, "--tls-key", certs.key), "--tls-cert")
    assert "no PEM certificate" in out


def test_a_certificate_given_as_the_key_is_refused(server_env: None, certs: Certificates) -> None:
    out = refused(bolt("server", "--tls-cert", certs.cert, "--tls-key", certs.cert), "--tls-key")
    assert "not an unencrypted PEM private key" in out


# --- bolt agent --ca -------------------------------------------------------------------------


def test_the_agent_refuses_a_ca_file_that_is_not_there(tmp_path: Path) -> None:
    missing = tmp_path / "ca.pem"
    args = ("agent", "--server", "https://127.0.0.1:1", "--token", "t", "--ca", missing)
    refused(bolt(*args), "--ca", str(missing))


def test_the_agent_refuses_a_ca_file_with_no_certificate(certs: Certificates) -> None:
    args = ("agent", "--server", "https://127.0.0.1:1", "--token", "t", "--ca", certs.key)
    refused(bolt(*args), "--ca", "no PEM CA certificate")


# --- where the bolt commands find the CA ----------------------------------------------------


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No BOLT_* variables; the saved client config under ``tmp_path``."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for name in ("BOLT_SERVER", "BOLT_TOKEN", "BOLT_CA"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def save_config(**saved: str) -> None:
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(saved))


def test_the_ca_comes_from_the_flag_then_bolt_ca_then_what_bolt_up_saved(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert resolve_ca(SAVED, None) is None, "nothing given: the system's trusted CAs"
    save_config(server=SAVED + "/", ca="/saved/ca.pem")
    assert resolve_ca(SAVED, None) == "/saved/ca.pem"
    monkeypatch.setenv("BOLT_CA", "/env/ca.pem")
    assert resolve_ca(SAVED, None) == "/env/ca.pem"
    assert resolve_ca(SAVED, "/flag/ca.pem") == "/flag/ca.pem"


def test_the_saved_ca_is_only_for_the_server_saved_with_it(env: Path) -> None:
    save_config(server=SAVED, ca="/saved/ca.pem")
    assert resolve_ca("https://bolt.example.com", None) is None


class Recorder:
    """Stands in for ``Client``: records the CA it was made with and lists no nodes."""

    def __init__(self) -> None:
        self.ca: str | Path | None = "never made"

    def __call__(self, server: str, token: str | None, ca: str | Path | None = None) -> Recorder:
        self.ca = ca
        return self

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def nodes(self) -> NodeList:
        return NodeList(nodes=[])


@pytest.fixture
def recorder(env: Path, monkeypatch: pytest.MonkeyPatch) -> Recorder:
    made = Recorder()
    monkeypatch.setattr(remote, "Client", made)
    monkeypatch.setenv("BOLT_TOKEN", "tok")
    return made


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(("nodes", "--ca", "/flag/ca.pem"), id="on the command"),
        pytest.param(("nodes", "--ca", "/flag/ca.pem", "list"), id="on the group"),
        pytest.param(("nodes", "list", "--ca", "/flag/ca.pem"), id="on the subcommand"),
    ],
)
def test_ca_on_the_command_line_reaches_the_client(recorder: Recorder, args: tuple[str]) -> None:
    result = bolt(*args)
    assert result.exit_code == 0, result.output
    assert recorder.ca == "/flag/ca.pem"


def test_without_any_ca_the_client_uses_the_system_store(recorder: Recorder) -> None:
    assert bolt("nodes").exit_code == 0
    assert recorder.ca is None


@pytest.mark.parametrize("source", ["--ca", "BOLT_CA", "saved CA"])
def test_a_ca_file_that_cannot_be_loaded_exits_2_naming_where_it_came_from(
    env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str
) -> None:
    missing = tmp_path / "ca.pem"
    args: tuple[str | Path, ...] = ("nodes", "--server", SAVED, "--token", "t")
    if source == "--ca":
        args += ("--ca", missing)
    elif source == "BOLT_CA":
        monkeypatch.setenv("BOLT_CA", str(missing))
    else:
        save_config(server=SAVED, ca=str(missing))
    out = refused(bolt(*args), f"{source} {missing}", "BOLT_CA")
    assert "No such file" in out


def test_bad_ca_names_the_file_and_the_reason(tmp_path: Path) -> None:
    from boltforge.tls import client_context

    (tmp_path / "empty.pem").write_text("")
    with pytest.raises(BadCA, match=r"empty\.pem: no PEM CA certificate"):
        client_context(tmp_path / "empty.pem")
