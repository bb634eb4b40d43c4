"""The base of every spec model a user writes (jobs, services, fleets, teams)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """A part of a spec: an unknown field is refused (a typo never passes silently), the
    model is immutable once read, and no number may be infinite or NaN."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
