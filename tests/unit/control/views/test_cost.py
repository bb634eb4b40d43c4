"""Cost accounting and team budgets against the real server app in-process: job meters that
add up exactly to pool usage times price, grouping by team, project and job, the window's
pro-rata edge, what a member may see, soft and hard budget limits, and ``bolt cost``."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from control_kit import ADMIN, AGENT, Fleet, Node, make_spec, postgres_server, store_url
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select
from typer.testing import CliRunner

from boltforge.client import Client
from boltforge.control.nodes.agents import LeaseTerms
from boltforge.control.store.models import EventRow, JobRow, ReplicaRow
from boltforge.core.billing.meter import Stretch, interrupted, meter_stretch
from boltforge.spec.errors import SpecError
from boltforge.spec.teams import Budget, parse_teams
from boltforge.wire.cost import CostReply, CostRow

__all__ = ["postgres_server", "store_url"]  # fixtures used by name

PRICES = {"h100": 4.0, "a100": 2.5}  # dollars per GPU-hour; binary fractions keep sums exact
T0 = datetime(2027, 3, 10, tzinfo=UTC).timestamp()
Q = 900.0  # a quarter hour


@dataclass
class PricedNode(Node):
    """A stand-in node of a priced pool."""

    pool: str = "h100"

    def inventory(self) -> dict[str, Any]:
        gpu = {"gpu": f"{self.pool.upper()}-80GB", "price_per_gpu_hour": PRICES[self.pool]}
        return {**super().inventory(), "pool": self.pool, **gpu}


def priced_fleet(tmp: Path, **config: Any) -> Fleet:
    """One 8-GPU H100 host at $4/GPU-h and one 8-GPU A100 host at $2.50, clock at ``T0``;
    leases outlast the scenarios, so nodes need not heartbeat while the clock jumps."""
    fleet = Fleet(tmp, hosts=0, terms=LeaseTerms(2.0, 1e8, 1e9), **config)
    fleet.clock.now = T0
    fleet.nodes = {
        "h-0": PricedNode(fleet, "h-0", "r0", pool="h100"),
        "a-0": PricedNode(fleet, "a-0", "r1", pool="a100"),
    }
    return fleet


def typed_spec(name: str, gpus: str, team: str, **extra: Any) -> dict[str, Any]:
    """``make_spec`` asking for a GPU model, e.g. ``8xH100``."""
    return {**make_spec(name, 8, team=team, **extra), "gpus": gpus}


def token(fleet: Fleet, name: str, role: str, team: str | None = None) -> dict[str, str]:
    r = fleet.post("/v1/tokens", {"name": name, "role": role, "team": team})
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['token']}"}


def cost(
    fleet: Fleet, by: str = "job", since: str = "30d", headers: dict[str, str] = ADMIN
) -> CostReply:
    r = fleet.http.get("/v1/cost", params={"by": by, "since": since}, headers=headers)
    assert r.status_code == 200, r.text
    return CostReply.model_validate(r.json())


def checkpoint(fleet: Fleet, job_id: str, at: float) -> None:
    """Rank 0 of ``job_id`` reports a checkpoint written at ``at``."""
    for node in fleet.nodes.values():
        for rep in node.to_run():
            if rep.job == job_id:
                node.report(
                    progress=[
                        {
                            "replica": rep.replica,
                            "job": rep.job,
                            "epoch": rep.epoch,
                            "rank": 0,
                            "step": 100,
                            "at": at,
                            "checkpoint": True,
                        }
                    ]
                )
                return


@pytest.fixture
def story(tmp_path: Path) -> Iterator[tuple[Fleet, dict[str, str]]]:
    """The fleet after ``play_story``."""
    with priced_fleet(tmp_path) as fleet:
        yield fleet, play_story(fleet)


@pytest.fixture
def story_on_both_stores(tmp_path: Path, store_url: str) -> Iterator[tuple[Fleet, dict[str, str]]]:
    """``story`` on SQLite, then on real PostgreSQL."""
    with priced_fleet(tmp_path, db_url=store_url) as fleet:
        yield fleet, play_story(fleet)


def play_story(fleet: Fleet) -> dict[str, str]:
    """Runs across both pools, a preemption after a checkpoint, a failure and an open run:

    - ``lo`` (nlp/pretrain, low, H100) runs 0-2Q, checkpoints at Q, is preempted at 2Q by
      ``hi``, and runs again from 3Q to now (5Q): 8 GPU-h, of which 2 lost;
    - ``hi`` (nlp/serve, serving, H100) runs 2Q-3Q and succeeds: 2 GPU-h;
    - ``vis`` (vision, normal, A100) runs 0-4Q and fails without a checkpoint: 8 GPU-h lost.
    """
    c = fleet.clock
    lo = typed_spec("lo", "8xH100", team="nlp", project="pretrain", priority="low")
    ids = {"lo": fleet.submit(lo), "vis": fleet.submit(typed_spec("vis", "8xA100", team="vision"))}
    fleet.start_everything()
    c.advance(Q)
    checkpoint(fleet, ids["lo"], c.now)
    c.advance(Q)
    hi = typed_spec("hi", "8xH100", team="nlp", project="serve", priority="serving")
    ids["hi"] = fleet.submit(hi)
    fleet.stop_everything()
    fleet.start_everything()
    c.advance(Q)
    fleet.finish(ids["hi"])
    fleet.start_everything()
    c.advance(Q)
    fleet.finish(ids["vis"], code=1)
    c.advance(Q)
    return ids


def pool_usage(fleet: Fleet) -> dict[str, float]:
    """GPU-hours each pool gave, from the replica table: each replica from its allocation's
    ``placed`` event to its exit (or now). Independent of the runs the meter reads."""
    pools = {n.name: n.pool for n in fleet.nodes.values() if isinstance(n, PricedNode)}
    out: dict[str, float] = defaultdict(float)
    with fleet.rt.db.session() as s:
        placed = {
            (e.job_id, e.data["epoch"]): e.at
            for e in s.scalars(select(EventRow).where(EventRow.kind == "placed"))
        }
        for r in s.scalars(select(ReplicaRow)):
            end = r.exited_at if r.exited_at is not None else fleet.clock.now
            out[pools[r.node]] += len(r.gpus) * (end - placed[(r.job_id, r.epoch)]) / 3600.0
    return dict(out)


def test_job_meters_add_up_exactly_to_pool_usage_times_price(
    story_on_both_stores: tuple[Fleet, dict[str, str]],
) -> None:
    fleet, ids = story_on_both_stores
    reply = cost(fleet, "job")
    usage = pool_usage(fleet)
    assert usage == {"h100": 10.0, "a100": 8.0}
    assert sum(r.dollars for r in reply.rows) == sum(usage[p] * PRICES[p] for p in usage) == 60.0
    assert sum(r.gpu_hours for r in reply.rows) == sum(usage.values())
    by_job = {r.job: r for r in reply.rows}
    lo, hi, vis = (by_job[ids[k]] for k in ("lo", "hi", "vis"))
    assert (lo.gpu_hours, lo.dollars) == (8.0, 32.0)
    assert (lo.productive_gpu_hours, lo.productive_dollars) == (6.0, 24.0)
    assert (hi.gpu_hours, hi.productive_dollars) == (2.0, 8.0)
    assert (vis.dollars, vis.productive_gpu_hours, vis.productive_dollars) == (20.0, 0.0, 0.0)
    assert reply.total.dollars == 60.0 and reply.total.productive_dollars == 32.0


def test_the_job_detail_carries_the_same_meter(story: tuple[Fleet, dict[str, str]]) -> None:
    fleet, ids = story
    d = fleet.job(ids["lo"])
    assert (d.gpu_hours, d.dollars, d.productive_gpu_hours, d.productive_dollars) == (
        8.0,
        32.0,
        6.0,
        24.0,
    )


def test_grouping_by_team_and_project_sums_the_jobs(story: tuple[Fleet, dict[str, str]]) -> None:
    fleet, _ = story
    teams = {r.key: r for r in cost(fleet, "team").rows}
    assert {k: (r.jobs, r.dollars, r.productive_dollars) for k, r in teams.items()} == {
        "nlp": (2, 40.0, 32.0),
        "vision": (1, 20.0, 0.0),
    }
    projects = {r.key: r for r in cost(fleet, "project").rows}
    assert {k: (r.team, r.project, r.dollars) for k, r in projects.items()} == {
        "nlp/pretrain": ("nlp", "pretrain", 32.0),
        "vision/-": ("vision", None, 20.0),
        "nlp/serve": ("nlp", "serve", 8.0),
    }
    assert cost(fleet, "project").rows[0].key == "nlp/pretrain"  # costliest first


def test_runs_straddling_the_window_count_pro_rata(story: tuple[Fleet, dict[str, str]]) -> None:
    """The last 1.5 quarter hours (3.5Q to 5Q): ``lo``'s open run gives 1.5Q, ``vis`` its last
    half quarter, which it lost; ``hi`` ended before the window and is absent."""
    fleet, ids = story
    reply = cost(fleet, "job", since=str(int(1.5 * Q)))
    by_job = {r.job: r for r in reply.rows}
    assert set(by_job) == {ids["lo"], ids["vis"]}
    assert (by_job[ids["lo"]].gpu_hours, by_job[ids["lo"]].dollars) == (3.0, 12.0)
    assert (by_job[ids["vis"]].gpu_hours, by_job[ids["vis"]].productive_gpu_hours) == (1.0, 0.0)
    earlier = cost(fleet, "job", since="5000")  # everything: 5Q = 4500 s
    assert earlier.total.dollars == 60.0


def test_a_member_sees_other_teams_only_as_totals(story: tuple[Fleet, dict[str, str]]) -> None:
    fleet, ids = story
    alice = token(fleet, "alice", "member", "vision")
    reply = cost(fleet, "job", headers=alice)
    assert [r.job for r in reply.rows] == [ids["vis"]]
    assert [(r.key, r.job, r.name, r.jobs, r.dollars) for r in reply.others] == [
        ("nlp", None, None, 2, 40.0)
    ]
    assert reply.total.dollars == 60.0
    assert {r.key for r in cost(fleet, "team", headers=alice).rows} == {"nlp", "vision"}
    projects = cost(fleet, "project", headers=alice)
    assert [r.key for r in projects.rows] == ["vision/-"]
    viewer = token(fleet, "finance", "viewer")
    assert len(cost(fleet, "job", headers=viewer).rows) == 3
    r = fleet.http.get("/v1/cost", headers=AGENT)
    assert r.status_code == 403


def test_a_bad_window_is_refused_naming_the_field(tmp_path: Path) -> None:
    with priced_fleet(tmp_path) as fleet:
        r = fleet.http.get("/v1/cost", params={"since": "last week"}, headers=ADMIN)
        assert r.status_code == 422
        assert r.json()["problems"][0]["field"] == "since"
        r = fleet.http.get("/v1/cost", params={"by": "user"}, headers=ADMIN)
        assert r.status_code == 422


def spend_quarter_hours(fleet: Fleet, quarters: int) -> None:
    """Team nlp runs a production job on the H100 host ($32/h) for ``quarters`` x Q."""
    job = fleet.submit(typed_spec("burn", "8xH100", team="nlp", priority="high"))
    fleet.start_everything()
    fleet.clock.advance(quarters * Q)
    fleet.finish(job)


def test_past_the_soft_limit_a_submission_is_warned(tmp_path: Path) -> None:
    budgets = {"nlp": Budget(monthly=40.0, soft=0.5)}
    with priced_fleet(tmp_path, budgets=budgets) as fleet:
        spend_quarter_hours(fleet, 3)  # $24: past $20, under $40
        r = fleet.post("/v1/jobs", {"spec": make_spec("next", 8, team="nlp")})
        assert r.status_code == 201, r.text
        (warning,) = r.json()["warnings"]
        assert "team nlp has spent $24.00 of its $40.00 budget for 2027-03" in warning
        assert "soft limit of $20.00" in warning
        events = fleet.job(r.json()["job"]["id"]).events
        assert [e.kind for e in events if e.kind == "budget"] == ["budget"]
        other = fleet.post("/v1/jobs", {"spec": make_spec("free", 8, team="vision")})
        assert other.json()["warnings"] == []
        (b,) = cost(fleet, "team").budgets
        assert (b.team, b.month, b.spent, b.state) == ("nlp", "2027-03", 24.0, "warn")


def test_at_the_hard_limit_only_production_work_is_admitted(tmp_path: Path, store_url: str) -> None:
    budgets = {"nlp": Budget(monthly=40.0, soft=0.5)}
    with priced_fleet(tmp_path, budgets=budgets, db_url=store_url) as fleet:
        spend_quarter_hours(fleet, 5)  # $40
        with fleet.rt.db.session() as s:
            before = len(list(s.scalars(select(JobRow))))
        for priority in ("normal", "low", 2, 3):
            spec = make_spec("exp", 8, team="nlp", priority=priority)
            r = fleet.post("/v1/jobs", {"spec": spec})
            assert r.status_code == 403, r.text
            error = r.json()["error"]
            assert "team nlp has spent $40.00 of its $40.00 budget for 2027-03" in error
            assert "To fix:" in error and "teams.nlp.budget.monthly" in error
        with fleet.rt.db.session() as s:
            assert len(list(s.scalars(select(JobRow)))) == before  # nothing written
        for priority in ("serving", "high"):
            spec = make_spec("prod", 8, team="nlp", priority=priority)
            r = fleet.post("/v1/jobs", {"spec": spec})
            assert r.status_code == 201, r.text
            assert "past the hard limit" in r.json()["warnings"][0]
        assert fleet.post("/v1/jobs", {"spec": make_spec("v", 8, team="vision")}).status_code == 201
        assert cost(fleet, "team").budgets[0].state == "over"


def test_a_new_month_starts_the_spend_again(tmp_path: Path) -> None:
    """A run across midnight on the 1st counts in the new month only from midnight."""
    budgets = {"nlp": Budget(monthly=40.0)}
    with priced_fleet(tmp_path, budgets=budgets) as fleet:
        fleet.clock.now = datetime(2027, 3, 31, 23, 30, tzinfo=UTC).timestamp()
        job = fleet.submit(typed_spec("long", "8xH100", team="nlp", priority="high"))
        fleet.start_everything()
        fleet.clock.advance(2 * 3600.0)  # 01:30 on April 1st
        (b,) = cost(fleet, "team").budgets
        assert (b.month, b.spent, b.state) == ("2027-04", 48.0, "over")
        assert fleet.job(job).dollars == 64.0


def test_budgets_name_the_bad_field() -> None:
    with pytest.raises(SpecError) as e:
        parse_teams({"teams": {"nlp": {"budget": {"monthly": 0, "soft": 1.5}}}}, "teams.yaml")
    fields = [p.field for p in e.value.problems]
    assert fields == ["teams.nlp.budget.monthly", "teams.nlp.budget.soft"]
    with pytest.raises(SpecError) as e:
        parse_teams({"teams": {"nlp": {"budjet": {"monthly": 10}}}})
    assert e.value.problems[0].field == "teams.nlp.budjet"
    spec = parse_teams({"teams": {"nlp": {"budget": {"monthly": 10000}}, "ops": {}}})
    assert spec.budgets() == {"nlp": Budget(monthly=10000.0, soft=0.8)}


@pytest.mark.parametrize(
    ("stretch", "since", "kept"),
    [
        (Stretch(8, 32.0, 0.0, 3600.0, 1800.0, interrupted=True), 0.0, 1800.0),
        (Stretch(8, 32.0, 0.0, 3600.0, None, interrupted=True), 0.0, 0.0),
        (Stretch(8, 32.0, 0.0, 3600.0, 1800.0, interrupted=False), 0.0, 3600.0),
        (Stretch(8, 32.0, 0.0, 3600.0, 1800.0, interrupted=True), 2700.0, 0.0),
        (Stretch(8, 32.0, 0.0, 3600.0, 2700.0, interrupted=True), 1800.0, 900.0),
        (Stretch(8, 32.0, 0.0, None, 900.0, interrupted=True), 0.0, 7200.0),
    ],
    ids=[
        "an-interrupted-run-keeps-the-work-up-to-its-checkpoint",
        "an-interrupted-run-without-a-checkpoint-keeps-nothing",
        "a-run-that-finished-its-job-keeps-everything",
        "a-window-after-the-checkpoint-sees-only-lost-work",
        "a-window-cuts-the-kept-and-the-lost-part-pro-rata",
        "an-open-run-is-productive-so-far",
    ],
)
def test_meter_rules(stretch: Stretch, since: float, kept: float) -> None:
    m = meter_stretch(stretch, since, 7200.0)
    assert m.productive_gpu_s == 8 * kept
    assert m.productive_dollars == 32.0 * kept / 3600.0
    assert m.gpu_s >= m.productive_gpu_s


def test_which_runs_count_as_interrupted() -> None:
    assert not interrupted(2, 100.0, 2, "succeeded", 100.0)
    assert not interrupted(2, 105.0, 2, "cancelled", 100.0)  # its replicas exited after
    assert interrupted(1, 100.0, 2, "succeeded", 200.0)  # an earlier, preempted run
    assert interrupted(2, 100.0, 2, "cancelled", 150.0)  # cancelled while waiting to resume
    assert interrupted(2, 100.0, 2, "failed", 100.0)
    assert interrupted(2, 100.0, 2, "requeued", None)
    assert not interrupted(2, None, 2, "running", None)


class InProcess(TestClient):
    """The app in-process, for ``Client`` (which passes a timeout the test client ignores)."""

    def request(self, *args: Any, **kw: Any) -> Any:
        kw.pop("timeout", None)
        return super().request(*args, **kw)


def cli_client(fleet: Fleet, headers: dict[str, str]) -> Client:
    """A ``Client`` whose calls go to ``fleet``'s app with ``headers``."""
    client = Client("http://testserver", "unused")
    client.http.close()
    client.http = InProcess(fleet.app, headers=headers)
    return client


def run_cli(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch, *args: str, headers: dict[str, str] = ADMIN
) -> str:
    import boltforge.cli.cost as cli_cost
    from boltforge.cli.main import app

    monkeypatch.setattr(cli_cost, "connect", lambda server, token: cli_client(fleet, headers))
    result = CliRunner().invoke(app, ["cost", *args])
    assert result.exit_code == 0, result.output
    return result.output


NO_CPU = ",0.000000,0.000000"  # vCPU-hours: the story's jobs hold no CPUs


def test_bolt_cost_prints_csv_for_chargeback(
    story: tuple[Fleet, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet, ids = story
    out = run_cli(fleet, monkeypatch, "--by", "job", "--since", "30d", "--csv")
    lines = out.splitlines()
    assert lines[0] == (
        "group,team,project,job,name,jobs,gpu_hours,dollars,productive_gpu_hours,"
        "productive_dollars,vcpu_hours,productive_vcpu_hours"
    )
    assert lines[1:] == [
        f"{ids['lo']},nlp,pretrain,{ids['lo']},lo,1,8.000000,32.000000,6.000000,24.000000{NO_CPU}",
        f"{ids['vis']},vision,,{ids['vis']},vis,1,8.000000,20.000000,0.000000,0.000000{NO_CPU}",
        f"{ids['hi']},nlp,serve,{ids['hi']},hi,1,2.000000,8.000000,2.000000,8.000000{NO_CPU}",
    ]


def test_bolt_cost_table_fits_80_columns_with_a_total(
    story: tuple[Fleet, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet, _ = story
    for by in ("team", "project", "job"):
        out = run_cli(fleet, monkeypatch, "--by", by)
        assert max(len(line) for line in out.splitlines()) <= 80, out
        total = next(line for line in out.splitlines() if line.startswith("TOTAL"))
        assert "$60.00" in total and "$32.00" in total and "44%" in total
    alice = token(fleet, "alice", "member", "vision")
    out = run_cli(fleet, monkeypatch, "--by", "job", headers=alice)
    assert "(other team)" in out and " lo " not in out


class Canned:
    """A client that answers ``cost`` with ``reply``."""

    def __init__(self, reply: CostReply) -> None:
        self.reply = reply

    def __enter__(self) -> Canned:
        return self

    def __exit__(self, *_: object) -> None:
        pass

    def cost(self, by: str, since: str) -> CostReply:
        return self.reply


def test_long_names_and_large_sums_still_fit_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    import boltforge.cli.cost as cli_cost
    from boltforge.cli.main import app

    big = {"gpu_hours": 987654.3, "dollars": 3950617.25}
    row = CostRow(
        key="12345_678",
        team="computer-vision-research",
        project="foundation-models",
        job="12345_678",
        name="llama-70b-pretrain-with-a-very-long-name",
        jobs=1,
        productive_gpu_hours=900000.0,
        productive_dollars=3600000.0,
        **big,
    )
    reply = CostReply(by="job", since=T0 - 86400 * 30, until=T0, rows=[row], total=row)
    monkeypatch.setattr(cli_cost, "connect", lambda server, token: Canned(reply))
    out = CliRunner().invoke(app, ["cost", "--by", "job"]).output
    assert max(len(line) for line in out.splitlines()) <= 80, out
    assert "$3,950,617.25" in out and "91%" in out


def test_bolt_submit_shows_the_budget_warning_and_the_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boltforge.cli.submit as cli_submit
    from boltforge.cli.main import app

    budgets = {"nlp": Budget(monthly=40.0, soft=0.5)}
    with priced_fleet(tmp_path, budgets=budgets) as fleet:
        monkeypatch.setattr(cli_submit, "connect", lambda server, token: cli_client(fleet, ADMIN))
        path = tmp_path / "job.yaml"
        path.write_text("name: exp\nteam: nlp\ngpus: 8\ncommand: [python, train.py]\n")
        spend_quarter_hours(fleet, 3)
        result = CliRunner().invoke(app, ["submit", str(path)])
        assert result.exit_code == 0, result.output
        assert "warning team nlp has spent $24.00 of its $40.00 budget" in result.output
        assert "submitted job" in result.output
        spend_quarter_hours(fleet, 2)  # $16 more, and $10 for the job on the A100 host
        result = CliRunner().invoke(app, ["submit", str(path)])
        assert result.exit_code == 1, result.output
        assert "error (403) team nlp has spent $50.00 of its $40.00 budget" in result.output
        result = CliRunner().invoke(app, ["submit", str(path), "--priority", "high"])
        assert result.exit_code == 0, result.output


def test_metrics_export_each_teams_spend_this_month_and_its_budget(tmp_path: Path) -> None:
    budgets = {"nlp": Budget(monthly=40.0, soft=0.5)}
    with priced_fleet(tmp_path, budgets=budgets) as fleet:
        spend_quarter_hours(fleet, 3)  # nlp: 8 H100 GPUs at $4 for 45 minutes
        text = fleet.http.get("/metrics").text
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }
        assert samples[("bolt_team_spend_dollars", (("team", "nlp"),))] == 24.0
        (b,) = cost(fleet, "team").budgets
        assert b.spent == 24.0
        limits = {k[1]: v for k, v in samples.items() if k[0] == "bolt_team_budget_dollars"}
        assert limits == {
            (("limit", "hard"), ("team", "nlp")): 40.0,
            (("limit", "soft"), ("team", "nlp")): 20.0,
        }
