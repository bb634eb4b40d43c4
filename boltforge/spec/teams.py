"""The teams file a server reads (``bolt server --teams teams.yaml``): each team's GPU quota,
when its unused guarantee is lent, and its budget.

```yaml
lending: {below: 0.5, after: 24h}          # server-wide default (this one is built in)
teams:
  nlp:
    quota: {guaranteed: 64, burst: 128}    # GPUs in any pool; or per pool: {h100: 64}
    lending: {below: 0.25, after: 12h}     # this team's own rule (optional)
    budget: {monthly: 10000, soft: 0.8}    # dollars per calendar month (UTC); warn at 80 %
    images: {require: true}                # containers only (see spec/images.py)
images: {registries: [localhost/]}         # server-wide image intake policy
```

``guaranteed`` GPUs are the team's entitlement: borrowers of them are preempted to give them
back. ``burst`` is the most the team may hold, borrowed GPUs included. A number means any pool
(``"*"`` in ``core/queueing/quota.py``); a mapping gives pools their own entries. A
guarantee used below ``lending.below`` of itself for ``lending.after`` is lent to the shared
pool until the team needs it again (``core/queueing/lending.py``); ``below: 0`` never lends.

``monthly`` is the hard limit in dollars: once a team's spend this month reaches it, its
non-production submissions (priority ``normal`` or ``low``) are refused. ``soft`` is the share
of ``monthly`` past which submissions are accepted with a warning (default 0.8).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import BeforeValidator, Field, ValidationError, model_validator

from boltforge.core.queueing.lending import DAY_S, LendRule
from boltforge.core.queueing.quota import ANY, QueueSpec, QuotaError, QuotaTree
from boltforge.spec import units
from boltforge.spec.errors import SpecError, from_validation
from boltforge.spec.images import ImagePolicy
from boltforge.spec.job import NAME
from boltforge.spec.loader import read_yaml
from boltforge.spec.strict import Strict

Duration = Annotated[float, BeforeValidator(units.seconds)]
Gpus = int | dict[str, int]


class Budget(Strict):
    """A team's monthly budget in dollars and the share of it that triggers warnings."""

    monthly: float = Field(gt=0)
    soft: float = Field(0.8, gt=0, le=1)

    @property
    def soft_dollars(self) -> float:
        return self.monthly * self.soft


class Quota(Strict):
    """A team's GPUs: ``guaranteed`` and at most ``burst``, in any pool (a number) or per pool."""

    guaranteed: Gpus = 0
    burst: Gpus | None = None

    def queue(self, team: str) -> QueueSpec:
        return QueueSpec(team, _pools(self.guaranteed), _pools(self.burst))

    @model_validator(mode="after")
    def _fits(self) -> Self:
        try:
            QuotaTree.build([self.queue("team")])
        except QuotaError as e:
            problems = (p.replace("queue team", "the quota") for p in e.problems)
            raise ValueError("; ".join(problems)) from None
        return self


class Lending(Strict):
    """Lend a guarantee used below ``below`` (a share of it) for ``after``."""

    below: float = Field(0.5, ge=0, le=1)
    after: Duration = DAY_S

    def rule(self) -> LendRule:
        return LendRule(self.below, self.after)


class TeamSpec(Strict):
    """What the server knows about one team."""

    quota: Quota | None = None
    lending: Lending | None = None
    budget: Budget | None = None
    images: ImagePolicy | None = None


class TeamsSpec(Strict):
    """Every configured team by name; teams not named here have no budget."""

    lending: Lending = Field(default_factory=Lending)
    images: ImagePolicy = Field(default_factory=ImagePolicy)
    teams: dict[Annotated[str, Field(pattern=NAME)], TeamSpec] = Field(default_factory=dict)

    def image_rule(self, team: str) -> ImagePolicy:
        """The image intake policy ``team``'s jobs meet: its own, else the server-wide one."""
        own = self.teams.get(team)
        return own.images if own is not None and own.images is not None else self.images

    def budgets(self) -> dict[str, Budget]:
        return {name: t.budget for name, t in self.teams.items() if t.budget is not None}

    def queues(self) -> list[QueueSpec]:
        """One queue per team with a quota, for ``QuotaTree.build``."""
        return [t.quota.queue(name) for name, t in sorted(self.teams.items()) if t.quota]

    def lend_rules(self) -> dict[str, LendRule]:
        """Each team with a guarantee and the rule that lends it (its own, else the default)."""
        return {
            q.path: (self.teams[q.path].lending or self.lending).rule()
            for q in self.queues()
            if any(q.guaranteed.values())
        }


def _pools(gpus: Gpus | None) -> dict[str, int]:
    if gpus is None:
        return {}
    if isinstance(gpus, int):
        return {ANY: gpus} if gpus else {}
    return dict(gpus)


def parse_teams(data: Any, source: str = "teams") -> TeamsSpec:
    """Validate a teams document; every problem names its field (``teams.nlp.budget.soft``)."""
    try:
        return TeamsSpec.model_validate(data if data is not None else {})
    except ValidationError as e:
        error = from_validation(source, "", e)
        problems = [replace(p, field=p.field.lstrip(".") or "(top level)") for p in error.problems]
        raise SpecError(source, problems) from None


def load_teams(path: str | Path) -> TeamsSpec:
    """Read and validate a teams file (``SpecError`` naming each bad field and its fix)."""
    return parse_teams(read_yaml(path), str(path))
