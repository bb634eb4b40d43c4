"""TLS for real: a ``bolt server`` serving HTTPS with a certificate from a local CA, an
agent that verifies it with ``--ca`` and registers, the ``bolt`` command with and without
that CA, an agent without it, plain HTTP to the HTTPS port, and ``bolt up --tls``."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from controlplane import AGENT, ROOT, Plane, bolt, control_plane, isolated_env

from boltforge.cli.localfleet import LocalFleet, free_port, inventory, stop
from boltforge.testing.processes import wait_until
from boltforge.tls import Certificates, make_certificates


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory, certs: Certificates) -> Iterator[Plane]:
    """A server on HTTPS with one agent that was given the CA and registered."""
    with control_plane(tmp_path_factory.mktemp("plane"), tls=certs) as p:
        p.add_agents(1, args=("--ca", str(certs.ca)))
        yield p


def no_ca_env(plane: Plane) -> dict[str, str]:
    """``bolt``'s environment for the plane (server and admin token) with no BOLT_CA."""
    return {k: v for k, v in plane.env().items() if k != "BOLT_CA"}


def clean_error(run: subprocess.CompletedProcess[str]) -> str:
    assert run.returncode in (1, 2), run.stdout + run.stderr
    assert "Traceback" not in run.stderr
    return run.stderr


def test_the_server_serves_https_and_an_agent_with_the_ca_registers(plane: Plane) -> None:
    assert plane.url.startswith("https://127.0.0.1:")
    with plane.client() as c:
        assert [(n.name, n.state) for n in c.nodes().nodes] == [("host-0", "ready")]


def test_bolt_with_the_ca_lists_the_nodes(plane: Plane, certs: Certificates) -> None:
    run = bolt("nodes", "--ca", str(certs.ca), "--json", env=no_ca_env(plane))
    assert run.returncode == 0, run.stderr
    assert [n["name"] for n in json.loads(run.stdout)["nodes"]] == ["host-0"]


def test_bolt_ca_in_the_environment_works_like_the_flag(plane: Plane, certs: Certificates) -> None:
    run = bolt("nodes", "--json", env=no_ca_env(plane) | {"BOLT_CA": str(certs.ca)})
    assert run.returncode == 0, run.stderr


def test_bolt_without_the_ca_says_the_certificate_did_not_verify_and_how_to_fix_it(
    plane: Plane,
) -> None:
    err = clean_error(bolt("nodes", env=no_ca_env(plane)))
    assert f"cannot verify the TLS certificate of {plane.url}" in err
    assert "--ca" in err and "BOLT_CA" in err


def test_bolt_with_another_ca_is_refused_the_same_way(plane: Plane, tmp_path: Path) -> None:
    other = make_certificates(tmp_path / "other")
    err = clean_error(bolt("nodes", "--ca", str(other.ca), env=no_ca_env(plane)))
    assert f"cannot verify the TLS certificate of {plane.url}" in err


def test_plain_http_to_the_https_port_gets_no_working_answer(plane: Plane) -> None:
    plain = plane.url.replace("https://", "http://")
    try:
        reply = httpx.get(f"{plain}/v1/nodes", headers={"Authorization": "Bearer x"}, timeout=10)
    except httpx.HTTPError:
        pass
    else:
        assert reply.status_code >= 400, reply.text
    err = clean_error(bolt("nodes", "--server", plain, env=no_ca_env(plane)))
    assert f"cannot reach {plain}" in err and "https://" in err


def test_an_agent_without_the_ca_says_why_and_never_registers(plane: Plane, tmp_path: Path) -> None:
    inv = tmp_path / "host-9.yaml"
    inv.write_text(inventory(9))
    log = tmp_path / "agent.log"
    line = ["agent", "--server", plane.url, "--token", AGENT, "--inventory", str(inv)]
    line += ["--work-dir", str(tmp_path / "work")]
    with log.open("ab") as out:
        agent = subprocess.Popen(
            [sys.executable, "-m", "boltforge.cli.main", *line],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=no_ca_env(plane),
            cwd=ROOT,
        )
    try:
        said = f"cannot verify the TLS certificate of {plane.url}"
        wait_until(lambda: said in log.read_text(), 60, "the agent to say why")
        assert "--ca" in log.read_text() and "Traceback" not in log.read_text()
        with plane.client() as c:
            assert [n.name for n in c.nodes().nodes] == ["host-0"]
    finally:
        agent.terminate()
        agent.wait(30)


def test_bolt_up_tls_makes_the_certificates_and_later_commands_verify_with_them(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in isolated_env(tmp_path).items() if k != "BOLT_CA"}
    port, data = free_port(), tmp_path / "fleet"
    args = ("--hosts", "1", "--port", str(port), "--data-dir", str(data), "--tls")
    try:
        up = bolt("up", "--detach", *args, env=env, timeout=240)
        assert up.returncode == 0, up.stdout + up.stderr
        saved = json.loads((tmp_path / "config" / "boltforge" / "client.json").read_text())
        assert saved["server"] == f"https://127.0.0.1:{port}"
        assert saved["ca"] == str(data / "tls" / "ca.pem")
        for key in ("server.key", "ca.key"):
            assert stat.S_IMODE((data / "tls" / key).stat().st_mode) == 0o600
        nodes = bolt("nodes", "--json", env=env)  # server, token and CA from the saved file
        assert nodes.returncode == 0, nodes.stderr
        assert [n["state"] for n in json.loads(nodes.stdout)["nodes"]] == ["ready"]
        down = bolt("down", "--data-dir", str(data), env=env, timeout=120)
        assert down.returncode == 0, down.stderr
    finally:
        left = LocalFleet.load(data)
        if left is not None:
            stop(left)
