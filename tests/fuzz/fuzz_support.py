"""Shared machinery of the fuzz targets: a time-bounded hypothesis loop and hostile strategies.

:func:`fuzz` runs one target for ``DSH_FUZZ_SECONDS`` seconds (default
:data:`DEFAULT_SECONDS`, so the normal test run stays fast) in chunks of
hypothesis examples, each chunk seeded from ``DSH_FUZZ_SEED`` (default 0), so
a run is reproducible from those two numbers. A failure is shrunk by
hypothesis and re-raised with the seed and chunk attached; the minimal input
then belongs in ``tests/corpus/regressions.py``.

The strategies generate arbitrary nested Python objects, mostly JSON, with the
things JSON cannot hold mixed in: NaN, infinities, ``-0.0``, bytes, sets,
subclasses of ``int``/``str``/``float``/``dict``/``list``, ``Decimal``,
plain objects, non-``str`` keys, lone surrogates, cycles and shared
sub-values. Inputs of the two open bugs R1/R2 (keys whose ``repr()`` recurses
or raises) are left out so the default run stays green; see
``tests/corpus/regressions.py``.
"""

from __future__ import annotations

import collections
import decimal
import http
import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from conftest_reliability import FIGURES
from corpus.hostile_values import Color, DictSub, FloatSub, IntSub, ListSub, StrSub
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

__all__ = [
    "DEFAULT_SECONDS",
    "anything",
    "fuzz",
    "hostile_keys",
    "json_values",
    "texts",
    "with_cycles",
]

DEFAULT_SECONDS = 0.5
CHUNK = 25


def budget() -> float:
    return float(os.environ.get("DSH_FUZZ_SECONDS", DEFAULT_SECONDS))


def fuzz(strategy: st.SearchStrategy[Any], target: Callable[[Any], None]) -> int:
    """Run ``target`` on examples of ``strategy`` for the time budget; returns how many ran."""
    base = int(os.environ.get("DSH_FUZZ_SEED", "0"))
    deadline = time.monotonic() + budget()
    examples = 0
    chunk = 0

    def counted(value: Any) -> None:
        nonlocal examples
        examples += 1
        target(value)

    while True:
        run = seed(base * 1_000_003 + chunk)(
            settings(
                max_examples=CHUNK,
                database=None,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                phases=(Phase.generate, Phase.shrink),
            )(given(strategy)(counted))
        )
        try:
            run()
        except BaseException as exc:
            exc.add_note(f"fuzz failure: reproduce with DSH_FUZZ_SEED={base} (chunk {chunk})")
            raise
        chunk += 1
        if time.monotonic() >= deadline:
            break
    FIGURES.fuzz_examples += examples
    return examples


# -- hostile values -----------------------------------------------------------------------------------


class Opaque:
    def __repr__(self) -> str:
        return "<Opaque>"


class Pair(NamedTuple):
    a: int
    b: int


# Strings with every category, lone surrogates included (hypothesis leaves Cs out by default).
texts = st.text(st.characters(exclude_categories=()), max_size=8)

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not (f == 0 and str(f).startswith("-"))),
    texts,
)

json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(texts, children, max_size=4)),
    max_leaves=20,
)

hostile_leaves = st.one_of(
    st.just(float("nan")),
    st.just(float("inf")),
    st.just(float("-inf")),
    st.just(-0.0),
    st.floats(),
    st.binary(max_size=3),
    st.binary(max_size=3).map(bytearray),
    st.sets(st.integers(), max_size=2),
    st.frozensets(st.integers(), max_size=2),
    st.builds(Opaque),
    st.integers().map(IntSub),
    texts.map(StrSub),
    st.floats(allow_nan=False).map(FloatSub),
    st.sampled_from([http.HTTPStatus.OK, Color.RED, decimal.Decimal("1.5"), complex(1, 2), Pair(1, 2), ..., int]),
)

# Non-str keys whose repr() is shallow and safe (R1/R2 excluded, see the module docstring).
hostile_keys = st.one_of(
    st.integers(),
    st.floats(),
    st.none(),
    st.booleans(),
    st.tuples(st.integers(), texts),
    st.binary(max_size=2),
    st.frozensets(st.integers(), max_size=2),
    texts.map(StrSub),
    st.builds(Opaque),
)

leaves = st.one_of(json_scalars, json_scalars, json_scalars, hostile_leaves)

anything = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(texts, children, max_size=4),
        st.dictionaries(st.one_of(texts, texts, hostile_keys), children, max_size=3),
        st.dictionaries(texts, children, max_size=2).map(collections.OrderedDict),
        st.dictionaries(texts, children, max_size=2).map(DictSub),
        st.lists(children, max_size=2).map(ListSub),
    ),
    max_leaves=25,
)


def _containers(value: Any) -> list[tuple[Any, list[Any]]]:
    """Every exact dict/list in ``value`` with its ancestors (root first), in walk order."""
    found: list[tuple[Any, list[Any]]] = []

    def walk(node: Any, ancestors: list[Any]) -> None:
        if type(node) in (dict, list):
            found.append((node, ancestors))
            children = node.values() if type(node) is dict else node
            for child in list(children):
                walk(child, [*ancestors, node])
        elif type(node) is tuple:
            for child in node:
                walk(child, [*ancestors, node])

    walk(value, [])
    return found


@st.composite
def with_cycles(draw: Any, base: st.SearchStrategy[Any] = anything) -> Any:
    """``base`` values, some given a cycle (a container holding an ancestor) or a shared sub-value."""
    value = draw(base)
    containers = _containers(value)
    if not containers or not draw(st.booleans()):
        return value
    node, ancestors = draw(st.sampled_from(containers))
    choice = draw(st.sampled_from(["cycle", "self", "shared"]))
    if choice == "cycle" and ancestors:
        inserted = draw(st.sampled_from([a for a in ancestors if type(a) in (dict, list)] or [node]))
    elif choice == "shared":
        others = [c for c, _ in containers if c is not node and all(c is not a for a in ancestors)]
        if not others:
            return value
        inserted = draw(st.sampled_from(others))
        # A shared sub-value must not contain ``node`` itself, or it would be a cycle after all.
        if any(c is node for c, _ in _containers(inserted)):
            return value
    else:
        inserted = node
    if type(node) is dict:
        node["\u21bb"] = inserted
    else:
        node.append(inserted)
    return value
