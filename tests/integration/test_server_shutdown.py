"""``bolt server`` shutting down while long-polls wait on it (an agent's or a bridge's wait
for desired states, ``bolt logs -f``, the console's event stream): each is answered at once
with what there is, the server exits, and its log holds no traceback."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from controlplane import ADMIN, control_plane


def test_a_long_poll_is_answered_when_the_server_shuts_down(tmp_path: Path) -> None:
    answered: dict[str, Any] = {}
    with control_plane(tmp_path) as plane:
        http = httpx.Client(base_url=plane.url, headers={"Authorization": f"Bearer {ADMIN}"})
        seq = http.get("/v1/agents/desired", params={"since": -1}).json()["seq"]

        def wait_for_changes() -> None:
            try:
                params = {"since": seq, "wait": 60}
                reply = http.get("/v1/agents/desired", params=params, timeout=90)
                answered["status"], answered["body"] = reply.status_code, reply.json()
            except httpx.HTTPError as e:
                answered["error"] = repr(e)

        poll = threading.Thread(target=wait_for_changes)
        poll.start()
        time.sleep(2.0)  # the poll is held open: nothing changes on a fleet without nodes
        assert not answered
        plane.server.send_signal(signal.SIGTERM)
        poll.join(60)
        code = plane.server.wait(60)
        log = plane.log("server")
    assert answered.get("status") == 200, answered
    assert answered["body"]["nodes"] == [] and not answered["body"]["full"]
    assert code in (0, -signal.SIGTERM)  # uvicorn raises the signal again once it is done
    assert "Traceback" not in log and "timeout graceful shutdown exceeded" not in log, log
