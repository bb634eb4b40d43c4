"""The intake policy on container images: which jobs a server accepts, by the image they run.

Set server-wide by ``bolt server --require-image --allowed-registry R --require-digest`` or by
the teams file's ``images:``, and per team by ``teams.NAME.images`` (which replaces the
server-wide rule for that team):

```yaml
images: {require: true, registries: [registry.acme.com/, localhost/]}
teams:
  infra:
    images: {require: false}        # infra may run processes
  finance-ml:
    images: {require: true, registries: [registry.acme.com/finance/], digest: true}
```

``require``: every role must run in a container (a job-level ``image``, or one per role).
``registries``: an image's name must start with one of these prefixes (a registry host with
its slash, ``registry.acme.com/``, or a deeper path, ``ghcr.io/acme/``); empty allows any.
``digest``: the image must be pinned by digest (``NAME@sha256:<64 hex>``), so what runs is
exactly what was reviewed. A job that breaks the rule is refused at submit, each problem
naming the field, the rule and the fix, and nothing is written.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field

from boltforge.spec.errors import _MISSING, SpecProblem
from boltforge.spec.job import JobSpec

DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


class ImagePolicy(BaseModel):
    """What a server (or one team) accepts as a job's container image (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    require: bool = False
    registries: list[str] = Field(default_factory=list)
    digest: bool = False

    @property
    def active(self) -> bool:
        """Whether the policy checks anything."""
        return self.require or bool(self.registries) or self.digest

    def problems(self, spec: JobSpec) -> list[SpecProblem]:
        """Each way ``spec`` breaks the policy, naming the field (``job.image``,
        ``job.roles[1].image``), the rule and the fix; empty when it complies."""
        out: list[SpecProblem] = []
        for where, image in _images(spec):
            if image is None:
                if self.require:
                    out.append(SpecProblem(where, _MISSING, _REQUIRED))
                continue
            out += self._image_problems(where, image)
        return out

    def _image_problems(self, where: str, image: str) -> list[SpecProblem]:
        out = []
        if self.registries and not any(image.startswith(r) for r in self.registries):
            allowed = ", ".join(self.registries)
            out.append(
                SpecProblem(
                    where,
                    image,
                    f"is not from an allowed registry (this server accepts {allowed}). "
                    "To fix: push the image to one of them and name it from there",
                )
            )
        if self.digest and not DIGEST.search(image):
            out.append(
                SpecProblem(
                    where,
                    image,
                    "must be pinned by digest under this server's policy. To fix: name it as "
                    "NAME@sha256:<digest> (e.g. from `podman image inspect --format "
                    "'{{.Digest}}' NAME`)",
                )
            )
        return out


_REQUIRED = (
    "is required: this server runs containerized work only. To fix: add "
    "`image: REGISTRY/NAME:TAG` (the job's, or each role's)"
)


def _images(spec: JobSpec) -> list[tuple[str, str | None]]:
    """Each field a replica's image comes from, once, with the image it names (None: the
    role has none)."""
    if not spec.roles:
        return [("job.image", spec.image)]
    out: dict[str, str | None] = {}
    for i, role in enumerate(spec.roles):
        if role.image or spec.image is None:
            out[f"job.roles[{i}].image"] = role.image
        else:
            out["job.image"] = spec.image
    return list(out.items())
