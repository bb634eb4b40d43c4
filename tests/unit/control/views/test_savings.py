"""Cost saved by sharing versus static team pools: the method, pure, and ``GET /v1/cost`` and
``bolt cost`` on an in-process server with a fake clock, figures worked out by hand."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_cost import T0, cost, priced_fleet, run_cli, typed_spec

from boltforge.control.store.models import NodeRow
from boltforge.core.billing.savings import Life, Use, peak, savings
from boltforge.wire.cost import SavingsOut

H = 3600.0


def test_peak_counts_overlapping_use_inside_the_window_only() -> None:
    uses = [Use("a", "p", 8, 0.0, 10.0), Use("a", "p", 4, 5.0, None), Use("a", "p", 2, 10.0, 20.0)]
    assert peak(uses, 0.0, 30.0) == 12
    assert peak(uses, 10.0, 30.0) == 6
    assert peak(uses, 40.0, 50.0) == 4
    assert peak([Use("a", "p", 8, 0.0, 5.0), Use("a", "p", 8, 5.0, 9.0)], 0.0, 9.0) == 8


def test_static_pools_pay_each_teams_peak_for_the_whole_window() -> None:
    uses = [Use("a", "h100", 8, 0.0, H), Use("b", "h100", 8, H, 2 * H)]
    lives = [Life("h100", 8, 4.0, 0.0, None)]
    s = savings(uses, lives, {"h100": 4.0}, 0.0, 2 * H)
    assert (s.static_dollars, s.shared_dollars, s.saved_dollars) == (128.0, 64.0, 64.0)
    assert s.peaks == {"a": {"h100": 8}, "b": {"h100": 8}}


def test_an_oversized_fleet_saves_a_negative_amount() -> None:
    lives = [Life("h100", 8, 4.0, 0.0, None), Life("h100", 8, 4.0, 0.0, H)]
    s = savings([Use("a", "h100", 4, 0.0, None)], lives, {"h100": 4.0}, 0.0, 2 * H)
    assert (s.static_dollars, s.shared_dollars, s.saved_dollars) == (32.0, 96.0, -64.0)


def test_the_window_starts_with_the_first_node() -> None:
    lives = [Life("h100", 8, 4.0, 10 * H, None)]
    s = savings([Use("a", "h100", 8, 10 * H, None)], lives, {"h100": 4.0}, 0.0, 12 * H)
    assert (s.since, s.hours, s.static_dollars, s.shared_dollars) == (10 * H, 2.0, 64.0, 64.0)


def test_the_server_reports_what_time_sharing_one_pool_saved(tmp_path: Path) -> None:
    """An H100 host ($4) and an A100 host ($2.50), both live for 2 h. nlp holds the 8 H100s
    for the first hour, vision for the second: static pools would be 8 H100s each for 2 h
    (2 x 8 x 4 x 2 = $128); the fleet cost 8 x 4 x 2 + 8 x 2.5 x 2 = $104; saved $24."""
    with priced_fleet(tmp_path) as fleet:
        nlp = fleet.submit(typed_spec("first", "8xH100", team="nlp"))
        fleet.start_everything()
        fleet.clock.advance(H)
        fleet.finish(nlp)
        fleet.submit(typed_spec("second", "8xH100", team="vision"))
        fleet.start_everything()
        fleet.clock.advance(H)
        s = cost(fleet, "team", since="2h").savings
        assert s is not None
        assert (s.hours, s.static_dollars, s.shared_dollars, s.saved_dollars) == (
            2.0,
            128.0,
            104.0,
            24.0,
        )
        assert s.peaks == {"nlp": {"h100": 8}, "vision": {"h100": 8}}


def test_an_oversized_fleet_shows_a_negative_saving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One team holds 8 H100s for 2 h while the A100 host idles: static $64, fleet $104,
    saved -$40; a 30-day window starts with the fleet, 2 h ago."""
    with priced_fleet(tmp_path) as fleet:
        fleet.submit(typed_spec("only", "8xH100", team="nlp"))
        fleet.start_everything()
        fleet.clock.advance(2 * H)
        s = cost(fleet, "team", since="30d").savings
        assert s == SavingsOut(
            since=T0,
            hours=2.0,
            static_dollars=64.0,
            shared_dollars=104.0,
            saved_dollars=-40.0,
            peaks={"nlp": {"h100": 8}},
        )
        out = run_cli(fleet, monkeypatch, "--by", "team")
        line = next(x for x in out.splitlines() if x.startswith("saved vs static pools"))
        assert line == "saved vs static pools: -$40.00 (static $64.00, fleet $104.00, 2.0 h)"


def test_a_dead_node_costs_until_its_lease_ran_out(tmp_path: Path) -> None:
    """The A100 host died with its lease running out half an hour in: the fleet cost
    8 x 4 x 1 + 8 x 2.5 x 0.5 = $42 over the hour; nothing ran, so static pools cost $0."""
    with priced_fleet(tmp_path) as fleet:
        with fleet.rt.db.session() as s:
            node = s.get(NodeRow, "a-0")
            assert node is not None
            node.state, node.lease_expires_at = "dead", T0 + H / 2
        fleet.clock.advance(H)
        saved = cost(fleet, "team", since="1h").savings
        assert saved is not None
        assert (saved.shared_dollars, saved.static_dollars, saved.saved_dollars) == (
            42.0,
            0.0,
            -42.0,
        )
