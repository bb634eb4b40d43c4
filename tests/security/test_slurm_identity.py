"""The Slurm bridge's boundary between teams (issue: a security pass). A job sent with ``bolt
submit`` and placed on Slurm nodes runs as its team's Slurm user, never root nor another
team's; a team with no user is refused with the option that fixes it; nothing a submitter
writes reaches the batch script unquoted; a server that accepts containerized work only
(``--require-image``) runs no bare process through Slurm either.

The first tests pin the rules against an in-memory Slurm and server; the rest run a real
slurmctld with 8 slurmd nodes (skipped where Slurm is not installed, unless
BOLT_REQUIRE_SLURM=1), where jobs are run by Slurm as the users it was given."""

from __future__ import annotations

import pwd
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_fakes import FakeServer, FakeSlurm, bridge, run, team_users, wants
from slurm_kit import SlurmFleet, scheduled_slurm, wait_until

from boltforge.client import ApiFailure
from boltforge.slurm.identity import NoIdentity, TeamUsers, parse_config, unchecked_accounts
from boltforge.slurm.launch import Unlaunchable, batch_script
from boltforge.wire.agent import ReplicaSpec
from boltforge.wire.jobs import TERMINAL, JobDetail, Problem, SubmitRequest

TRAIN = ("python", "train.py")
INJECTED = "X=1; touch {path}; Y"  # an env key that is a shell command in an unquoted export


def replica(env: dict[str, str], **extra: object) -> ReplicaSpec:
    return ReplicaSpec.model_validate(
        {"replica": "5.1.0", "job": "5", "epoch": 1, "action": "run", "command": ["true"],
         "env": env, **extra}
    )  # fmt: skip


def failures(server: FakeServer) -> list[str]:
    return [e.detail for e in server.events if e.kind == "failed"]


# -- the batch script ---------------------------------------------------------------------------


def test_an_env_key_that_is_a_shell_command_is_refused_and_never_run(tmp_path: Path) -> None:
    pwned = tmp_path / "pwned"
    spec = replica({INJECTED.format(path=pwned): "1"})
    with pytest.raises(Unlaunchable, match="not a POSIX variable name"):
        batch_script({"n1": spec})
    assert not pwned.exists()


def test_env_values_reach_the_job_as_text_never_as_commands(tmp_path: Path) -> None:
    pwned = tmp_path / "pwned"
    nasty = f"$(touch {pwned}); `touch {pwned}`; ' \" \\ \n; touch {pwned}"
    script = batch_script({"n1": replica({"NOTE": nasty}, command=["sh", "-c", 'echo "$NOTE"'])})
    srun = tmp_path / "srun"  # a stand-in srun: runs the task here
    srun.write_text('#!/bin/sh\nwhile [ "${1#-}" != "$1" ]; do shift; done\nexec "$@"\n')
    srun.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "SLURMD_NODENAME": "n1"}
    done = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True)
    assert done.stdout == nasty + "\n" and not pwned.exists()


def test_a_bolt_submit_job_with_a_bad_env_key_fails_with_the_reason_and_nothing_is_submitted() -> (
    None
):
    slurm, server = FakeSlurm(), FakeServer()
    b = bridge(slurm, server)
    run(b)
    wants(b, "run", "9", 1, ["n1"], command=TRAIN)
    b.state.desired["n1"][0].env[INJECTED.format(path="/tmp/pwned")] = "1"
    run(b, passes=2)
    assert slurm.commands("submit_held") == []
    [why] = failures(server)
    assert "env key" in why and "POSIX" in why


# -- who a made job runs as ---------------------------------------------------------------------


def test_a_bolt_submit_job_is_submitted_as_its_teams_user_never_the_bridges() -> None:
    slurm, server = FakeSlurm(), FakeServer()
    server.teams["9"] = "research"
    b = bridge(slurm, server)
    run(b)
    wants(b, "run", "9", 1, ["n1"], command=TRAIN)
    run(b, passes=2)
    [(as_user, cwd)] = slurm.submitters
    assert as_user == ("runuser", "-u", "bolt-research", "--")
    assert cwd == "/home/r"  # no workdir: its output goes to the user's home, not the bridge's


def test_a_team_with_no_user_is_refused_naming_the_option_that_fixes_it() -> None:
    slurm, server = FakeSlurm(), FakeServer()
    server.teams["9"] = "ghosts"
    b = bridge(slurm, server)
    run(b)
    wants(b, "run", "9", 1, ["n1"], command=TRAIN)
    run(b, passes=3)
    assert slurm.commands("submit_held") == []  # never run as root, nor as anyone else
    [why] = failures(server)
    assert "team ghosts has no Slurm user" in why and "--team-user ghosts=USER" in why


@pytest.mark.parametrize(
    ("users", "team", "says"),
    [
        pytest.param({"ops": "root"}, "ops", "root", id="root"),
        pytest.param({"a": "bolt-batch", "b": "bolt-batch"}, "b", "team a's too", id="shared"),
        pytest.param({"a": "nobody-here"}, "a", "does not exist", id="missing"),
        pytest.param({}, "nlp", "has no Slurm user", id="unmapped"),
    ],
)
def test_a_team_is_never_run_as_root_another_teams_user_or_a_missing_one(
    users: dict[str, str], team: str, says: str
) -> None:
    with pytest.raises(NoIdentity, match=says):
        team_users(users).run_as(team)


def test_a_pattern_maps_every_other_team_but_never_onto_a_named_teams_user() -> None:
    users = team_users({"research": "bolt-batch"}, pattern="bolt-{team}")
    with pytest.raises(NoIdentity, match="team research's too"):
        users.run_as("batch")  # bolt-batch is research's: batch may not share it


def test_a_bridge_not_running_as_root_cannot_submit_as_a_team_user() -> None:
    entry = pwd.struct_passwd(("bolt-nlp", "x", 1001, 1001, "", "/home/n", "/bin/sh"))
    as_itself = TeamUsers({"nlp": "bolt-nlp"}, lookup=lambda _: entry, euid=1001)
    with pytest.raises(NoIdentity, match="the bridge's own user"):
        as_itself.run_as("nlp")
    as_other = TeamUsers({"nlp": "bolt-nlp"}, lookup=lambda _: entry, euid=1500)
    with pytest.raises(NoIdentity, match="run the bridge as root"):
        as_other.run_as("nlp")


# -- the team of an sbatch job ------------------------------------------------------------------

CONFIG = """Configuration data as of 2026-11-28T16:00:00
AccountingStorageEnforce = {enforce}
AccountingStorageType   = {storage}
ClusterName             = lab
"""


@pytest.mark.parametrize(
    ("storage", "enforce", "checked"),
    [
        pytest.param("accounting_storage/none", "none", False, id="no slurmdbd"),
        pytest.param("accounting_storage/slurmdbd", "none", False, id="not enforced"),
        pytest.param("accounting_storage/slurmdbd", "associations,limits", True, id="enforced"),
        pytest.param("accounting_storage/slurmdbd", "safe", True, id="safe implies it"),
    ],
)
def test_the_bridge_says_when_any_slurm_user_may_name_any_team(
    storage: str, enforce: str, checked: bool
) -> None:
    why = unchecked_accounts(parse_config(CONFIG.format(storage=storage, enforce=enforce)))
    assert (why is None) == checked
    if why is not None:
        assert "-A naming any team" in why and "AccountingStorageEnforce=associations" in why


# -- --require-image ----------------------------------------------------------------------------


def test_a_job_with_an_image_is_not_run_as_a_bare_process_through_slurm() -> None:
    slurm, server = FakeSlurm(), FakeServer()
    b = bridge(slurm, server)
    run(b)
    wants(b, "run", "9", 1, ["n1"], command=TRAIN)
    b.state.desired["n1"][0].image = "registry.acme.com/train:1"
    run(b, passes=2)
    assert slurm.commands("submit_held") == []
    [why] = failures(server)
    assert "runs no containers" in why


def test_an_sbatch_job_the_image_policy_refuses_says_what_its_user_can_do() -> None:
    slurm, server = FakeSlurm(), FakeServer()
    sid = slurm.submit(job_id=7, account="research")
    server.refuse_with = ApiFailure(
        422,
        "invalid job spec",
        [Problem(field="job.image", value=None, message="is required: ...")],
    )
    run(bridge(slurm, server))
    comment = slurm.queue[sid].comment
    assert comment.startswith("boltforge: refused:") and "outside any container" in comment
    assert "teams.research.images" in comment


# -- a real Slurm -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmFleet]:
    with scheduled_slurm(tmp_path_factory.mktemp("slurm")) as f:
        yield f


def ended(fleet: SlurmFleet, job: str) -> JobDetail:
    wait_until(lambda: fleet.api.job(job).state in TERMINAL, 60, f"job {job} to end")
    return fleet.api.job(job)


def story(detail: JobDetail) -> str:
    return " | ".join(e.message for e in detail.events)


def made_for(fleet: SlurmFleet, job: str) -> list[dict[str, object]]:
    """The Slurm jobs the bridge made for Boltforge job ``job``."""
    return [j for sid, j in fleet.queue().items() if fleet.boltforge_id(sid) == job]


def test_a_bolt_submit_job_runs_as_its_teams_slurm_user_without_the_bridges_token(
    fleet: SlurmFleet,
) -> None:
    out = fleet.shared / "who.txt"
    record = f"id -un > {out}; env >> {out}"
    spec = {"name": "who", "team": "research", "gpus": 8, "command": ["sh", "-c", record]}
    job = fleet.api.submit(SubmitRequest(spec=spec)).job.id
    assert ended(fleet, job).state == "succeeded", story(fleet.api.job(job))
    who, *env = out.read_text().splitlines()
    assert who == "bolt-research"
    [made] = made_for(fleet, job)
    assert made["user_name"] == "bolt-research"  # Slurm's own word (squeue -o %u)
    assert not any(fleet.server.admin_token in line for line in env)


def test_the_bridge_warns_that_this_clusters_accounts_are_unchecked(fleet: SlurmFleet) -> None:
    assert "Slurm does not check accounts here" in fleet.log()  # no slurmdbd in the tests


def test_a_bolt_submit_job_of_a_team_with_no_slurm_user_fails_saying_how_to_map_it(
    fleet: SlurmFleet,
) -> None:
    ran = fleet.shared / "ghosts-ran"
    spec = {"name": "ghost", "team": "ghosts", "gpus": 8, "command": ["touch", str(ran)]}
    job = fleet.api.submit(SubmitRequest(spec=spec)).job.id
    detail = ended(fleet, job)
    assert detail.state == "failed"
    assert "--team-user ghosts=USER" in story(detail)
    assert made_for(fleet, job) == [] and not ran.exists()


def test_an_env_key_that_is_a_shell_command_never_runs_on_a_slurm_node(fleet: SlurmFleet) -> None:
    pwned = fleet.shared / "pwned"
    spec = {
        "name": "inject",
        "team": "research",
        "gpus": 8,
        "command": ["true"],
        "env": {INJECTED.format(path=pwned): "1"},
    }
    try:
        job = fleet.api.submit(SubmitRequest(spec=spec)).job.id
    except ApiFailure as e:  # intake refuses it first: the bridge never sees it
        assert e.status == 422
    else:
        detail = ended(fleet, job)
        assert detail.state == "failed" and "POSIX" in story(detail)
        assert made_for(fleet, job) == []
    assert not pwned.exists()


def sbatch_as(fleet: SlurmFleet, user: str, script: str, *options: str) -> str:
    """Send ``script`` with ``sbatch`` as the Slurm user ``user``; its Slurm job id."""
    path = fleet.shared / f"job-{len(list(fleet.shared.iterdir()))}.sh"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    cmd = ["runuser", "-u", user, "--", "sbatch", "--parsable", f"--chdir={fleet.shared}"]
    sent = subprocess.run(
        [*cmd, *options, str(path)], env=fleet.slurm.env, capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    return sent.stdout.strip().split(";")[0]


def release_as(fleet: SlurmFleet, user: str, job: str) -> subprocess.CompletedProcess[str]:
    cmd = ["runuser", "-u", user, "--", "scontrol", "release", job]
    return subprocess.run(cmd, env=fleet.slurm.env, capture_output=True, text=True)


def test_an_sbatch_job_stays_the_slurm_user_who_sent_it(fleet: SlurmFleet) -> None:
    done = fleet.shared / "sbatch-who"
    sid = sbatch_as(fleet, "bolt-batch", f"id -un > {done}\n", "-A", "batch", "-N1", "--gres=gpu:8")
    bf = wait_until(lambda: fleet.boltforge_id(sid), 20, "the bridge to take it")
    assert ended(fleet, bf).state == "succeeded"
    assert done.read_text().strip() == "bolt-batch"
    assert fleet.squeue(sid)["user_name"] == "bolt-batch"


@pytest.fixture(scope="module")
def images_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmFleet]:
    with scheduled_slurm(tmp_path_factory.mktemp("slurm"), ["--require-image"]) as f:
        yield f


def test_require_image_refuses_sbatch_jobs_and_runs_no_image_job_as_a_bare_process(
    images_only: SlurmFleet,
) -> None:
    fleet = images_only
    sid, _ = fleet.trainer("bare", "-N1", "--gres=gpu:8", "-A", "research", steps=5)
    wait_until(lambda: "refused" in str(fleet.squeue(sid)["comment"]), 20, "a reason")
    assert "outside any container" in str(fleet.squeue(sid)["comment"])
    assert fleet.boltforge_id(sid) is None and fleet.squeue(sid)["job_state"] == "PENDING"

    ran = fleet.shared / "image-ran"
    spec = {"name": "boxed", "team": "research", "gpus": 8, "image": "localhost/train:1",
            "command": ["touch", str(ran)]}  # fmt: skip
    job = fleet.api.submit(SubmitRequest(spec=spec)).job.id
    detail = ended(fleet, job)
    assert detail.state == "failed" and "runs no containers" in story(detail)
    assert made_for(fleet, job) == [] and not ran.exists()


def test_a_slurm_user_cannot_release_a_job_the_image_policy_refused(
    images_only: SlurmFleet,
) -> None:
    """job_submit.lua lets only the bridge (root) release a job Boltforge holds: released by
    its user, the refused batch script would run under Slurm's own scheduling."""
    fleet = images_only
    ran = fleet.shared / "released-ran"
    sid = sbatch_as(fleet, "bolt-batch", f"touch {ran}\n", "-A", "batch", "-N1", "--gres=gpu:8")
    wait_until(lambda: "refused" in str(fleet.squeue(sid)["comment"]), 20, "a reason")
    tried = release_as(fleet, "bolt-batch", sid)
    assert tried.returncode != 0 and "denied" in tried.stderr
    job = fleet.squeue(sid)
    assert (job["job_state"], job["state_reason"], job["priority"]) == ("PENDING", "JobHeldUser", 0)
    assert not ran.exists()
