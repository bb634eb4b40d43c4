"""``bolt demo``, the acceptance story: a fleet of real processes, a low-priority training job
preempted by a high-priority one, its checkpoint, its resume from the last step, both done."""

from __future__ import annotations

import re
from pathlib import Path

from controlplane import bolt, isolated_env


def test_the_demo_tells_the_whole_story(tmp_path: Path) -> None:
    run = bolt("demo", env=isolated_env(tmp_path), timeout=400)
    out = run.stdout
    assert run.returncode == 0, out + run.stderr
    for said in (
        "fleet up",
        "research submits examples/jobs/train-low.yaml: job 1",
        "job 1 placed: 32 x H100-80GB on 4 host(s)",
        "nlp submits examples/jobs/train-high.yaml: job 2",
        "job 2 preempted 1 job(s): 1 (research, 32 GPU(s))",
        "job 1 checkpointed in",
        "job 2 succeeded",
        "(resumes from its last checkpoint)",
        "job 1 resumed:",
        "job 1 succeeded",
        "fleet stopped",
    ):
        assert said in out, out
    assert out.index("job 2 succeeded") < out.index("job 1 succeeded")
    resumed = re.search(r"job 1 log: resumed from step (\d+)", out)
    before = re.search(r"last reported step before the stop: (\d+)", out)
    assert resumed and before, out
    assert 0 < int(resumed.group(1)) < 600 and int(before.group(1)) > 0
    assert "600 steps" in out and "200 steps" in out
