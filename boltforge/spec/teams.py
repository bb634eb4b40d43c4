"""The teams file a server reads (``bolt server --teams teams.yaml``): each team's budget.

```yaml
teams:
  nlp:
    budget: {monthly: 10000, soft: 0.8}   # dollars per calendar month (UTC); warn at 80 %
```

``monthly`` is the hard limit in dollars: once a team's spend this month reaches it, its
non-production submissions (priority ``normal`` or ``low``) are refused. ``soft`` is the share
of ``monthly`` past which submissions are accepted with a warning (default 0.8).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from boltforge.spec.errors import SpecError, from_validation
from boltforge.spec.loader import read_yaml


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Budget(_Strict):
    """A team's monthly budget in dollars and the share of it that triggers warnings."""

    monthly: float = Field(gt=0)
    soft: float = Field(0.8, gt=0, le=1)

    @property
    def soft_dollars(self) -> float:
        return self.monthly * self.soft


class TeamSpec(_Strict):
    """What the server knows about one team."""

    budget: Budget | None = None


class TeamsSpec(_Strict):
    """Every configured team by name; teams not named here have no budget."""

    teams: dict[str, TeamSpec] = Field(default_factory=dict)

    def budgets(self) -> dict[str, Budget]:
        return {name: t.budget for name, t in self.teams.items() if t.budget is not None}


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
