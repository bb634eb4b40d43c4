"""Label and field selectors, as ``labelSelector`` / ``fieldSelector`` query parameters and
as a PodDisruptionBudget's ``spec.selector`` write them.

Labels: ``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x)``, ``a``, ``!a``, joined
by commas. Fields: ``label=value``, ``label==value``, ``label!=value`` over the labels the
resource supports (``metadata.name``, ``metadata.namespace`` and the resource's own, such as
``spec.nodeName``, where an absent field reads as the empty string); any other label is 400
BadRequest ``field label not supported``, as kube-apiserver answers. Value escapes
(``\\,``) and the ``>``/``<`` label operators are not supported."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from boltforge.testing.kubeapi.errors import bad_request
from boltforge.testing.kubeapi.objects import JSON
from boltforge.testing.kubeapi.resources import Resource

KEY = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_./]*$")
SET_TERM = re.compile(r"^(\S+)\s+(in|notin)\s*\((.*)\)$")
Test = Callable[[Mapping[str, str]], bool]


@dataclass(frozen=True)
class Requirement:
    """``key`` ``op`` ``values``; op is one of ``=``, ``!=``, ``in``, ``notin``, ``exists``,
    ``!``."""

    key: str
    op: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and labels[self.key] in self.values
        return not present or labels[self.key] not in self.values


@dataclass(frozen=True)
class LabelSelector:
    """Every requirement must hold; no requirements matches everything."""

    requirements: tuple[Requirement, ...]

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        found = labels or {}
        return all(r.matches(found) for r in self.requirements)

    def matches_object(self, obj: JSON) -> bool:
        return self.matches((obj.get("metadata") or {}).get("labels"))


def parse_labels(text: str | None) -> LabelSelector | None:
    """The selector ``text`` writes (None when empty); 400 when it does not parse."""
    if not text or not text.strip():
        return None
    return LabelSelector(tuple(_requirement(term.strip()) for term in _split(text)))


def _split(text: str) -> list[str]:
    terms, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    return terms


def _requirement(term: str) -> Requirement:
    found = SET_TERM.match(term)
    if found:
        values = frozenset(v.strip() for v in found.group(3).split(",") if v.strip())
        return Requirement(_key(found.group(1), term), found.group(2), values)
    for op, name in (("!=", "!="), ("==", "="), ("=", "=")):
        if op in term:
            key, _, value = term.partition(op)
            return Requirement(_key(key.strip(), term), name, frozenset([value.strip()]))
    if term.startswith("!"):
        return Requirement(_key(term[1:].strip(), term), "!")
    return Requirement(_key(term, term), "exists")


def _key(key: str, term: str) -> str:
    if not KEY.match(key):
        raise bad_request(f"unable to parse requirement: invalid label key {key!r} in {term!r}")
    return key


EXPRESSION_OPS = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}


def from_spec(selector: Mapping[str, Any] | None) -> LabelSelector | None:
    """A metav1.LabelSelector (``matchLabels``, ``matchExpressions``); None for a null
    selector (which matches nothing), an empty selector matches everything."""
    if selector is None:
        return None
    reqs = [
        Requirement(k, "=", frozenset([v])) for k, v in (selector.get("matchLabels") or {}).items()
    ]
    for expr in selector.get("matchExpressions") or []:
        op = EXPRESSION_OPS.get(expr.get("operator", ""), "exists")
        reqs.append(Requirement(expr["key"], op, frozenset(expr.get("values") or [])))
    return LabelSelector(tuple(reqs))


@dataclass(frozen=True)
class FieldSelector:
    """Terms ``(label, equal, value)``; every one must hold."""

    terms: tuple[tuple[str, bool, str], ...]

    def matches(self, obj: JSON) -> bool:
        return all(
            (field_value(obj, label) == value) == equal for label, equal, value in self.terms
        )


def parse_fields(text: str | None, res: Resource) -> FieldSelector | None:
    """The selector ``text`` writes for ``res`` (None when empty); 400 on an unknown label."""
    if not text or not text.strip():
        return None
    terms = []
    for term in text.split(","):
        op = next((o for o in ("!=", "==", "=") if o in term), None)
        if op is None:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{term}'")
        label, _, value = term.partition(op)
        label = label.strip()
        if label not in ("metadata.name", "metadata.namespace", *res.fields):
            raise bad_request(f"field label not supported: {label}")
        terms.append((label, op != "!=", value.strip()))
    return FieldSelector(tuple(terms))


def field_value(obj: JSON, label: str) -> str:
    """The value field ``label`` has in ``obj``, as a string ("" when absent)."""
    if label == "source":
        label = "source.component"
    found: Any = obj
    for part in label.split("."):
        found = found.get(part) if isinstance(found, dict) else None
    if isinstance(found, bool):
        return "true" if found else "false"
    if found is None:
        return "false" if label == "spec.unschedulable" else ""
    return str(found)
