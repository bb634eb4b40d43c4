"""``bolt up`` and ``bolt down``: a development fleet of real server and agent processes,
detached or in the foreground, with the address and admin token saved for later commands."""

from __future__ import annotations

import json
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

from controlplane import ROOT, bolt, isolated_env

from boltforge.cli.localfleet import LocalFleet, free_port, ours, stop
from boltforge.testing.processes import wait_until


def saved_config(home: Path) -> Path:
    return home / "config" / "boltforge" / "client.json"


def fleet_pids(data: Path) -> list[int]:
    fleet = LocalFleet.load(data)
    assert fleet is not None
    return [fleet.server, *fleet.agents]


def test_up_detach_then_down(tmp_path: Path) -> None:
    env = isolated_env(tmp_path)
    port, data = free_port(), tmp_path / "fleet"
    args = ("--hosts", "2", "--port", str(port), "--data-dir", str(data))
    try:
        up = bolt("up", "--detach", *args, env=env, timeout=240)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "bolt down" in up.stdout
        config = saved_config(tmp_path)
        assert stat.S_IMODE(config.stat().st_mode) == 0o600
        assert json.loads(config.read_text())["server"] == f"http://127.0.0.1:{port}"
        pids = fleet_pids(data)
        assert len(pids) == 3 and all(ours(p) for p in pids)

        nodes = bolt("nodes", "--json", env=env)  # server and token from the saved file
        assert nodes.returncode == 0, nodes.stderr
        listed = json.loads(nodes.stdout)["nodes"]
        assert [(n["name"], n["rack"], n["gpus"], n["state"]) for n in listed] == [
            ("host-0", "r0", 8, "ready"),
            ("host-1", "r0", 8, "ready"),
        ]
        again = bolt("up", "--detach", *args, env=env)
        assert again.returncode == 1 and "already up" in again.stderr

        down = bolt("down", "--data-dir", str(data), env=env, timeout=120)
        assert down.returncode == 0, down.stderr
        assert not any(ours(p) for p in pids)
        assert not config.exists() and not (data / "up.json").exists()
        assert (data / "logs" / "server.log").exists()
        assert bolt("down", "--data-dir", str(data), env=env).returncode == 1
    finally:
        left = LocalFleet.load(data)
        if left is not None:
            stop(left)


def test_up_in_the_foreground_stops_on_ctrl_c(tmp_path: Path) -> None:
    env = isolated_env(tmp_path)
    data = tmp_path / "fleet"
    args = ["up", "--hosts", "1", "--port", str(free_port()), "--data-dir", str(data)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "boltforge.cli.main", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        wait_until(lambda: saved_config(tmp_path).exists() or proc.poll() is not None, 240)
        pids = fleet_pids(data)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out
        assert "Ctrl-C stops it" in out and "stopped" in out
        assert not any(ours(p) for p in pids)
        assert not saved_config(tmp_path).exists()
    finally:
        if proc.poll() is None:
            proc.kill()
        left = LocalFleet.load(data)
        if left is not None:
            stop(left)


def test_up_refuses_a_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        args = ("--port", str(port), "--data-dir", str(tmp_path / "f"))
        run = bolt("up", *args, env=isolated_env(tmp_path))
    assert run.returncode == 2 and f"port {port} is in use" in run.stderr
