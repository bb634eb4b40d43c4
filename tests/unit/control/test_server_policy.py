"""The server preempts by its own knobs (minimum runtime, cooldown, churn budget) and otherwise
as the policy says: the default's peer window holds in the server as in the simulator."""

from __future__ import annotations

from boltforge.control.runtime import server_policy
from boltforge.core.policy import named
from boltforge.core.preempt.victims import PreemptRules

KNOBS = PreemptRules(min_runtime_s=0.0, cooldown_s=0.0, churn_fraction=1.0)


def test_the_default_keeps_its_peer_window_under_the_servers_knobs() -> None:
    policy = server_policy("default", KNOBS)
    assert policy.preemption is not None
    rules = policy.preemption.rules
    own = named("default").preemption
    assert own is not None and own.rules.peer_window_s is not None
    assert rules.peer_window_s == own.rules.peer_window_s
    assert (rules.min_runtime_s, rules.cooldown_s, rules.churn_fraction) == (0.0, 0.0, 1.0)
    assert policy.preemption.bump == own.bump


def test_a_window_the_server_sets_wins() -> None:
    policy = server_policy("default", PreemptRules(peer_window_s=60.0))
    assert policy.preemption is not None and policy.preemption.rules.peer_window_s == 60.0


def test_a_policy_that_never_preempts_stays_so() -> None:
    assert server_policy("fifo", KNOBS).preemption is None
    tiresias = server_policy("tiresias", KNOBS).preemption
    assert tiresias is not None and tiresias.rules == KNOBS
