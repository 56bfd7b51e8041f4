"""``sole_exception``: the one real failure inside the groups trio makes of a single error."""

from __future__ import annotations

import pytest
import trio

from dsh_core import sole_exception


async def test_a_nurserys_group_of_one_yields_the_childs_error() -> None:
    async def fail() -> None:
        raise ValueError("boom")

    with pytest.raises(BaseExceptionGroup) as caught:
        async with trio.open_nursery() as outer:
            outer.start_soon(fail)
    found = sole_exception(caught.value)
    assert type(found) is ValueError and str(found) == "boom"


def test_groups_of_one_are_opened_at_any_depth() -> None:
    inner = KeyError("k")
    assert sole_exception(ExceptionGroup("a", [ExceptionGroup("b", [inner])])) is inner


def test_a_group_of_several_and_a_bare_exception_are_returned_as_they_are() -> None:
    several = ExceptionGroup("a", [ValueError("x"), KeyError("y")])
    assert sole_exception(several) is several
    wrapped = ExceptionGroup("outer", [several])
    assert sole_exception(wrapped) is several
    bare = RuntimeError("r")
    assert sole_exception(bare) is bare
