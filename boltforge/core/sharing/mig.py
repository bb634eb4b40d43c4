"""MIG geometry: NVIDIA's GPU-instance profiles and where each may sit on a GPU.

A MIG-capable GPU has ``SLICES`` memory slices. A GPU instance of a profile covers ``size``
consecutive slices starting at one of the profile's allowed ``starts`` (the placements
``nvidia-smi mig -lgipp`` lists); instances of one GPU never overlap. A ``Carve`` is the set
of instances a GPU is cut into, each named by its start slice, so a carve is valid exactly
when every instance sits at an allowed start and no two share a slice (the compute limit of
seven follows from NVIDIA's placement table).
"""

from __future__ import annotations

from dataclasses import dataclass

SLICES = 8


@dataclass(frozen=True, slots=True)
class Profile:
    """One GPU-instance profile: compute slices, memory, memory slices covered, allowed starts."""

    name: str
    compute: int
    memory_gb: float
    size: int
    starts: tuple[int, ...]


@dataclass(frozen=True, slots=True, order=True)
class Instance:
    """One GPU instance of a carve: the profile it has and the first memory slice it covers."""

    start: int
    profile: str

    def slices(self, model: str) -> range:
        return range(self.start, self.start + profile(model, self.profile).size)


Carve = tuple[Instance, ...]


def _family(memory_unit: int) -> dict[str, Profile]:
    """The profile table of a GPU whose smallest instance has ``memory_unit`` GB."""
    u = memory_unit
    rows = [
        (f"1g.{u}gb", 1, u, 1, (0, 1, 2, 3, 4, 5, 6)),
        (f"1g.{2 * u}gb", 1, 2 * u, 2, (0, 2, 4, 6)),
        (f"2g.{2 * u}gb", 2, 2 * u, 2, (0, 2, 4)),
        (f"3g.{4 * u}gb", 3, 4 * u, 4, (0, 4)),
        (f"4g.{4 * u}gb", 4, 4 * u, 4, (0,)),
        (f"7g.{8 * u}gb", 7, 8 * u, 8, (0,)),
    ]
    return {name: Profile(name, c, float(m), s, st) for name, c, m, s, st in rows}


MODELS: dict[str, dict[str, Profile]] = {
    "A100-40GB": _family(5),
    "A100-80GB": _family(10),
    "H100-80GB": _family(10),
}


def model_of(gpu_type: str, memory_gb: float) -> str | None:
    """The MIG model of a pool's GPUs (``A100``/``H100`` by name and memory), or None when
    the GPU has no MIG table here."""
    name = gpu_type.upper()
    for model in MODELS:
        family, size = model.split("-")
        if name.startswith(family) and abs(memory_gb - float(size[:-2])) < 1.0:
            return model
    return None


def profile(model: str, name: str) -> Profile:
    """The profile ``name`` of ``model``; ValueError naming the valid ones when it has none."""
    try:
        return MODELS[model][name]
    except KeyError:
        known = ", ".join(MODELS.get(model, {}))
        raise ValueError(f"{model} has no MIG profile {name!r} (it has: {known})") from None


def problems(model: str, carve: Carve) -> list[str]:
    """Why ``carve`` is not a valid geometry for ``model`` (empty when it is)."""
    out: list[str] = []
    used: set[int] = set()
    for inst in carve:
        try:
            prof = profile(model, inst.profile)
        except ValueError as err:
            out.append(str(err))
            continue
        if inst.start not in prof.starts:
            out.append(f"{inst.profile} may start at slice {prof.starts}, not {inst.start}")
        cover = set(range(inst.start, inst.start + prof.size))
        if cover & used:
            out.append(f"{inst.profile} at slice {inst.start} overlaps another instance")
        used |= cover
    return out


def valid(model: str, carve: Carve) -> bool:
    return not problems(model, carve)


def used_slices(model: str, carve: Carve) -> frozenset[int]:
    return frozenset(s for inst in carve for s in inst.slices(model))


def _room(model: str, used: frozenset[int]) -> int:
    """How many (profile, start) placements still fit beside ``used``, weighted by size: the
    score that keeps the large instances placeable."""
    return sum(
        prof.size
        for prof in MODELS[model].values()
        for start in prof.starts
        if not used & set(range(start, start + prof.size))
    )


def add(model: str, carve: Carve, name: str) -> Instance | None:
    """Where a new ``name`` instance goes in the slices ``carve`` leaves unused, keeping the
    most room for later instances (ties: the lowest start); None when it fits nowhere. Existing
    instances are not moved."""
    prof = profile(model, name)
    used = used_slices(model, carve)
    best: tuple[int, int] | None = None
    for start in prof.starts:
        cover = frozenset(range(start, start + prof.size))
        if used & cover:
            continue
        score = _room(model, used | cover)
        if best is None or score > best[0]:
            best = (score, start)
    return None if best is None else Instance(best[1], name)


def layout(model: str, names: list[str] | tuple[str, ...]) -> Carve:
    """A carve holding one instance per name, placed largest first; ValueError when the
    profiles do not fit one GPU together."""
    carve: Carve = ()
    for name in sorted(names, key=lambda n: -profile(model, n).size):
        inst = add(model, carve, name)
        if inst is None:
            raise ValueError(f"{' + '.join(names)} does not fit on one {model}")
        carve = tuple(sorted((*carve, inst)))
    return carve


def describe(carve: Carve) -> str:
    """``3g.40gb@0 + 1g.10gb@4``: each instance and its start slice."""
    return " + ".join(f"{i.profile}@{i.start}" for i in carve) or "no instances"
