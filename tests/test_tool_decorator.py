"""``@tool``: schemas, output contract and description from a typed function."""

from __future__ import annotations

import datetime
import enum
import pathlib
import uuid
from typing import Annotated, Any, Literal, NotRequired, Required, TypedDict

import attrs
import pytest

from dsh_core import (
    JsonValue,
    RetryPolicy,
    SchemaSpecError,
    TextBlock,
    ToolDefinition,
    ToolEffects,
    ToolRunContext,
    UserMessage,
    thaw,
    tool,
)
from dsh_core._tool_decorator import _docstring
from dsh_core.testing import expect_failure, expect_success, make_input, make_runtime


@attrs.frozen
class Forecast:
    day: int
    summary: str
    rain_mm: float | None = None


@tool(effects=ToolEffects(read_only=True))
async def weather(city: str, days: int = 1, unit: Literal["C", "F"] = "C") -> list[Forecast]:
    """The forecast for a city.

    Several lines of description
    are kept together.

    Args:
        city: the city's name,
            in English.
        days (int): how many days ahead.

    Returns:
        One forecast per day.
    """
    return [Forecast(day=n, summary=f"{city} {unit}") for n in range(days)]


def test_the_schema_comes_from_the_signature_and_the_docstring() -> None:
    assert isinstance(weather, ToolDefinition)
    assert weather.name == "weather"
    assert weather.description == "The forecast for a city.\n\nSeveral lines of description\nare kept together."
    assert thaw(weather.parameters) == {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "city": {"type": "string", "description": "the city's name, in English."},
            "days": {"type": "integer", "description": "how many days ahead.", "default": 1},
            "unit": {"type": "string", "enum": ["C", "F"], "default": "C"},
        },
        "required": ["city"],
    }
    assert weather.effects == ToolEffects(read_only=True)


def test_the_output_schema_comes_from_the_return_annotation() -> None:
    items = weather.output.schema["items"]
    assert weather.output.schema["type"] == "array"
    assert items["type"] == "object" and items["additionalProperties"] is False
    assert set(items["required"]) == {"day", "summary"}
    assert items["properties"]["rain_mm"] == {"oneOf": [{"type": "number"}, {"type": "null"}], "default": None}


async def test_a_decorated_tool_runs_and_returns_plain_json() -> None:
    runtime = make_runtime(weather)
    result = expect_success(await runtime.execute(make_input("weather", {"city": "Oslo", "days": 2})))
    assert thaw(result.value) == [
        {"day": 0, "summary": "Oslo C", "rain_mm": None},
        {"day": 1, "summary": "Oslo C", "rain_mm": None},
    ]


async def test_arguments_are_validated_before_the_function_runs() -> None:
    runtime = make_runtime(weather)
    result = expect_failure(await runtime.execute(make_input("weather", {"city": "Oslo", "unit": "K"})))
    assert result.code == "INVALID_ARGS"
    result = expect_failure(await runtime.execute(make_input("weather", {"city": "Oslo", "extra": 1})))
    assert result.code == "INVALID_ARGS"


async def test_a_wrong_return_value_breaks_the_output_contract() -> None:
    @tool
    async def count(text: str) -> int:
        """Count."""
        return "many"  # type: ignore[return-value]

    result = expect_failure(await make_runtime(count).execute(make_input("count", {"text": "x"})))
    assert result.code == "INVALID_TOOL_OUTPUT"


async def test_a_plain_function_runs_inline_and_annotated_text_describes() -> None:
    @tool(name="add_numbers", description="Add two numbers.")
    def add(a: Annotated[int, "the first"], b: int) -> int:
        return a + b

    assert add.name == "add_numbers" and add.inline
    assert add.parameters["properties"]["a"] == {"type": "integer", "description": "the first"}
    result = expect_success(await make_runtime(add).execute(make_input("add_numbers", {"a": 2, "b": 40})))
    assert result.value == 42


async def test_a_run_context_parameter_is_not_a_model_argument() -> None:
    @tool
    async def note(text: str, run: ToolRunContext) -> str:
        """Leave a note."""
        run.defer_context(UserMessage(content=(TextBlock(f"noted {text}"),)))
        return run.call_id

    assert list(note.parameters["properties"]) == ["text"]
    result = expect_success(await make_runtime(note).execute(make_input("note", {"text": "hi"}, call_id="c7")))
    assert result.value == "c7"
    assert result.additional_contexts[0].content == (TextBlock("noted hi"),)


def test_a_second_run_context_parameter_is_refused_with_every_other_problem() -> None:
    def twice(first: ToolRunContext, second: ToolRunContext, n) -> int:  # type: ignore[no-untyped-def]
        """Twice."""
        return 0

    with pytest.raises(SchemaSpecError) as info:
        tool(twice)
    assert info.value.violations == (
        "@tool \"twice\": parameters 'first' and 'second' both ask for the ToolRunContext; declare it once",
        "@tool \"twice\": parameter 'n' has no type annotation",
    )


async def test_options_reach_define_tool() -> None:
    attempts = 0

    @tool(retry=RetryPolicy(initial_delay_s=0, jitter=0), is_concurrency_safe=lambda args: args.n > 0)
    async def flaky(n: int) -> int:
        """Fails once."""
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise ConnectionError("reset")
        return n

    assert flaky.is_concurrency_safe is not None and flaky.is_concurrency_safe({"n": 1}) is True
    assert expect_success(await make_runtime(flaky).execute(make_input("flaky", {"n": 3}))).value == 3


def test_a_function_without_a_docstring_or_description_is_refused() -> None:
    def nameless(a: int) -> int:
        return a

    with pytest.raises(TypeError, match='@tool "nameless": give the model a description'):
        tool(nameless)


def test_a_function_without_a_return_annotation_is_refused() -> None:
    def no_return(a: int):  # type: ignore[no-untyped-def]
        """Does things."""

    with pytest.raises(TypeError, match="annotate what it returns"):
        tool(no_return)


def test_every_unusable_parameter_is_reported() -> None:
    def bad(a, *rest: int, **more: int) -> int:  # type: ignore[no-untyped-def]
        """Bad."""
        return 0

    with pytest.raises(SchemaSpecError) as info:
        tool(bad)
    assert info.value.violations == (
        "@tool \"bad\": parameter 'a' has no type annotation",
        "@tool \"bad\": parameter 'rest' must be passable by name (no *args, **kwargs or /)",
        "@tool \"bad\": parameter 'more' must be passable by name (no *args, **kwargs or /)",
    )


def test_an_annotation_the_schema_cannot_express_is_reported() -> None:
    def mixed(a: int | str) -> int:
        """Mixed."""
        return 0

    with pytest.raises(SchemaSpecError, match="the union"):
        tool(mixed)

    def returns_set(a: int) -> set[int]:
        """Set."""
        return set()

    with pytest.raises(SchemaSpecError, match="returns_set -> return: the annotation set"):
        tool(returns_set)


def test_output_cannot_be_given_twice() -> None:
    def f(a: int) -> int:
        """F."""
        return a

    with pytest.raises(TypeError, match="drop output="):
        tool(output={"type": "integer"})(f)


def test_a_docstring_without_sections_is_the_whole_description() -> None:
    @tool
    def echo(text: str) -> str:
        """Echo the text back, unchanged."""
        return text

    assert echo.description == "Echo the text back, unchanged."
    assert "description" not in echo.parameters["properties"]["text"]


def test_any_and_none_returns() -> None:
    @tool
    def anything(x: Any) -> Any:
        """Anything."""
        return x

    @tool
    def nothing(x: int) -> None:
        """Nothing."""

    assert dict(anything.output.schema) == {}
    assert dict(nothing.output.schema) == {"type": "null"}
    assert anything.parameters["properties"]["x"] == {}


async def test_a_plain_function_can_run_in_a_worker_thread() -> None:
    import threading

    main_thread = threading.get_ident()

    @tool(in_thread=True)
    def blocking(x: int) -> bool:
        """Runs off the event loop."""
        return threading.get_ident() != main_thread

    assert not blocking.inline
    assert expect_success(await make_runtime(blocking).execute(make_input("blocking", {"x": 1}))).value is True


def test_an_async_function_cannot_ask_for_a_thread() -> None:
    async def coroutine_tool(x: int) -> int:
        """Async."""
        return x

    with pytest.raises(TypeError, match="in_thread=True takes a plain def"):
        tool(in_thread=True)(coroutine_tool)


class Point(TypedDict):
    x: int
    y: Annotated[int, "the vertical one"]
    label: NotRequired[str]


class Options(TypedDict, total=False):
    precise: bool
    unit: Required[Literal["m", "km"]]


async def test_typed_dicts_are_closed_objects_with_their_required_keys() -> None:
    @tool
    def move(point: Point, options: Options) -> Point:
        """Move a point one step right."""
        return {"x": point["x"] + 1, "y": point["y"], "label": options["unit"]}

    point_schema = thaw(move.parameters)["properties"]["point"]
    assert point_schema == {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "x": {"type": "integer"},
            "y": {"type": "integer", "description": "the vertical one"},
            "label": {"type": "string"},
        },
        "required": ["x", "y"],  # NotRequired, even with postponed annotations
    }
    assert thaw(move.parameters)["properties"]["options"]["required"] == ["unit"]  # total=False, but Required
    assert thaw(move.output.schema) == point_schema
    runtime = make_runtime(move)
    moved = await runtime.execute(make_input("move", {"point": {"x": 1, "y": 2}, "options": {"unit": "km"}}))
    assert thaw(expect_success(moved).value) == {"x": 2, "y": 2, "label": "km"}
    bad = await runtime.execute(make_input("move", {"point": {"x": 1, "y": 2, "z": 3}, "options": {"unit": "km"}}))
    assert expect_failure(bad).code == "INVALID_ARGS"
    missing = await runtime.execute(make_input("move", {"point": {"x": 1, "y": 2}, "options": {"precise": True}}))
    assert expect_failure(missing).code == "INVALID_ARGS"


class Node(TypedDict):
    name: str
    children: list[Node]


def test_a_typed_dict_that_contains_itself_is_refused() -> None:
    def walk(tree: Node) -> int:
        """Walk."""
        return 0

    with pytest.raises(SchemaSpecError, match="the TypedDict Node contains itself"):
        tool(walk)


# ---------------------------------------------------------------------------
# The return annotation is enforced where the output schema cannot say it all


@attrs.frozen
class Reading:
    celsius: float = attrs.field(validator=attrs.validators.ge(-273.15))


async def test_a_returned_dict_value_of_the_wrong_type_breaks_the_output_contract() -> None:
    @tool
    def counts() -> dict[str, int]:
        """Counts."""
        return {"a": 1, "b": "not an int"}  # type: ignore[dict-item]

    assert dict(counts.output.schema) == {"type": "object"}  # the schema cannot say the value type
    result = expect_failure(await make_runtime(counts).execute(make_input("counts", {})))
    assert result.code == "INVALID_TOOL_OUTPUT" and result.error.info is not None
    assert result.error.info.name == "ToolOutputError"
    assert result.error.message == (
        "tool \"counts\" returned invalid output: expected an integer, got a string @ value['b']"
    )


async def test_a_returned_value_is_checked_by_the_validators_of_its_classes() -> None:
    @tool
    async def readings(raw: list[float]) -> list[Reading]:
        """Readings."""
        return [{"celsius": value} for value in raw]  # type: ignore[misc]

    runtime = make_runtime(readings)
    good = expect_success(await runtime.execute(make_input("readings", {"raw": [20.5]})))
    assert thaw(good.value) == [{"celsius": 20.5}]
    bad = expect_failure(await runtime.execute(make_input("readings", {"raw": [20.5, -300.0]})))
    assert bad.code == "INVALID_TOOL_OUTPUT"
    assert "'celsius' must be >= -273.15" in bad.error.message and "@ value[1]" in bad.error.message


async def test_a_return_the_schema_says_fully_is_not_structured_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from dsh_core._schema._attrs_params import ValueType

    checked: list[object] = []
    original = ValueType.violations

    def spy(self: ValueType, value: object, *, root: str = "$") -> list[str]:
        checked.append(value)
        return original(self, value, root=root)

    monkeypatch.setattr(ValueType, "violations", spy)

    @tool
    def forecasts(days: int) -> list[Forecast]:
        """Forecasts."""
        return [Forecast(day=n, summary="fine") for n in range(days)]

    @tool
    def totals(days: int) -> dict[str, int]:
        """Totals."""
        return {"days": days}

    for definition in (forecasts, totals):
        expect_success(await make_runtime(definition).execute(make_input(definition.name, {"days": 2})))
    assert checked == [{"days": 2}]  # only the dict[str, int] result needed the check


def _nest(depth: int, leaf: Any) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def _depth_of(value: Any) -> tuple[int, Any]:
    depth = 0
    while isinstance(value, (list, tuple)):
        assert len(value) == 1
        value, depth = value[0], depth + 1
    return depth, value


async def test_a_deeply_nested_return_value_comes_back_whole() -> None:
    @tool
    async def fetch(depth: int) -> dict[str, Any]:
        """A nested JSON document."""
        return {"doc": _nest(depth, "leaf")}

    result = expect_success(await make_runtime(fetch).execute(make_input("fetch", {"depth": 10_000})))
    assert isinstance(result.value, dict)
    assert _depth_of(result.value["doc"]) == (10_000, "leaf")


async def test_a_return_value_that_contains_itself_breaks_the_output_contract_naming_the_cycle() -> None:
    @tool
    def loop() -> dict[str, Any]:
        """Loop."""
        box: list[Any] = []
        box.append(box)
        return {"box": box}

    result = expect_failure(await make_runtime(loop).execute(make_input("loop", {})))
    assert result.code == "INVALID_TOOL_OUTPUT"
    assert "$.box[0]: cycle: the value contains itself" in result.error.message


@attrs.frozen
class Page:
    title: str
    body: Any
    forecasts: tuple[Forecast, ...] = ()


async def test_attrs_values_are_unstructured_at_any_depth_of_plain_data_around_and_inside_them() -> None:
    @tool
    def pages(depth: int) -> list[Any]:
        """Pages."""
        inner = Page(title="inner", body={"forecast": Forecast(day=2, summary="rain"), "n": (1, 2)})
        return [_nest(depth, Page(title="outer", body=_nest(depth, inner), forecasts=(Forecast(1, "sun"),)))]

    result = expect_success(await make_runtime(pages).execute(make_input("pages", {"depth": 5_000})))
    depth, outer = _depth_of(result.value[0])  # type: ignore[index]
    assert depth == 5_000
    assert thaw(outer["forecasts"]) == [{"day": 1, "summary": "sun", "rain_mm": None}]
    depth, inner = _depth_of(outer["body"])
    assert depth == 5_000
    assert thaw(inner) == {
        "title": "inner",
        "body": {"forecast": {"day": 2, "summary": "rain", "rain_mm": None}, "n": [1, 2]},
        "forecasts": [],
    }


# ---------------------------------------------------------------------------
# Signatures: any valid one makes a tool, or the decoration says what to change


async def test_a_keyword_only_parameter_without_a_default_may_follow_one_with_a_default() -> None:
    @tool
    def join(a: int = 1, *, b: int, run: ToolRunContext, c: str = "-") -> str:
        """Join."""
        return f"{a}{c}{b}"

    assert join.parameters["required"] == ("b",)
    result = expect_success(await make_runtime(join).execute(make_input("join", {"b": 2})))
    assert result.value == "1-2"


async def test_underscored_names_keep_their_own_name() -> None:
    @tool
    def pick(_x: int, x: int) -> list[int]:
        """Pick."""
        return [_x, x]

    assert list(pick.parameters["properties"]) == ["_x", "x"]
    result = expect_success(await make_runtime(pick).execute(make_input("pick", {"_x": 1, "x": 2})))
    assert thaw(result.value) == [1, 2]


def test_names_the_arguments_class_cannot_hold_are_refused() -> None:
    def odd(self: int, __x: int, __y__: int, _setattr: int, ok: int) -> int:
        """Odd."""
        return ok

    with pytest.raises(SchemaSpecError) as info:
        tool(odd)
    reason = "'self', '_setattr', '_cached_setattr_get' and names starting with '__' cannot be argument names"
    assert info.value.violations == tuple(
        f'@tool "odd": parameter {name!r} needs another name: {reason}' for name in ("self", "__x", "__y__", "_setattr")
    )


def test_a_generator_function_is_refused() -> None:
    def lines(n: int) -> Any:
        """Lines."""
        yield from range(n)

    async def chunks(n: int) -> Any:
        """Chunks."""
        yield n

    for function in (lines, chunks):
        with pytest.raises(TypeError, match="a generator function cannot be a tool; return the whole value"):
            tool(function)


# ---------------------------------------------------------------------------
# Defaults


async def test_each_call_gets_its_own_copy_of_a_mutable_default() -> None:
    @tool
    def grow(items: list[int] = [1, 2], limits: dict[str, int] = {"a": 1}) -> list[int]:  # noqa: B006
        """Grow."""
        items.append(3)
        limits["a"] += 1
        return [*items, limits["a"]]

    assert thaw(grow.parameters["properties"]["items"]["default"]) == [1, 2]
    runtime = make_runtime(grow)
    for _ in range(2):
        result = expect_success(await runtime.execute(make_input("grow", {})))
        assert thaw(result.value) == [1, 2, 3, 2]
    given = expect_success(await runtime.execute(make_input("grow", {"items": [7]})))
    assert thaw(given.value) == [7, 3, 2]


async def test_a_default_the_annotation_allows_is_kept() -> None:
    @tool
    def maybe(a: int | None = None, b: float = 1, c: tuple[int, ...] = (), d: Any = object) -> str:
        """Maybe."""
        return f"{a} {b} {c}"

    assert maybe.parameters["properties"]["a"]["default"] is None
    assert expect_success(await make_runtime(maybe).execute(make_input("maybe", {}))).value == "None 1 ()"


def test_a_default_that_is_not_a_value_of_its_annotation_is_refused_with_every_other_problem() -> None:
    sentinel = object()

    def wrong(
        a: int = None,  # type: ignore[assignment]  # noqa: RUF013
        b: int = "five",  # type: ignore[assignment]
        c: list[int] = [1, "2"],  # type: ignore[list-item]  # noqa: B006
        d: str = sentinel,  # type: ignore[assignment]
        e: int | str = 1,  # type: ignore[assignment]
    ) -> set[int]:
        """Wrong."""
        return set()

    with pytest.raises(SchemaSpecError) as info:
        tool(wrong)
    violations = info.value.violations
    assert violations[:3] == (
        "@tool \"wrong\": the default of parameter 'a', None, is not a value of its annotation "
        "(expected an integer, got null @ default)",
        "@tool \"wrong\": the default of parameter 'b', 'five', is not a value of its annotation "
        "(expected an integer, got a string @ default)",
        "@tool \"wrong\": the default of parameter 'c', [1, '2'], is not a value of its annotation "
        "(expected an integer, got a string @ default[1])",
    )
    assert violations[3].startswith("@tool \"wrong\": the default of parameter 'd', <object object at ")
    assert violations[3].endswith("(expected a string, got object @ default)")
    assert violations[4].startswith("wrong.e: the union int | str is not supported")
    assert violations[5].startswith("wrong -> return: the annotation set[int] is not supported")
    assert len(violations) == 6


# ---------------------------------------------------------------------------
# Docstrings


def test_a_parameter_type_with_parentheses_keeps_its_description() -> None:
    @tool
    def typed(a: dict[str, int], b: str) -> int:
        """Typed.

        Args:
            a (dict(str, int)): the counts.
            b (Literal["x", "y"]): pick one (x or y): x is first.
        """
        return 0

    assert typed.parameters["properties"]["a"]["description"] == "the counts."
    assert typed.parameters["properties"]["b"]["description"] == "pick one (x or y): x is first."


def test_keyword_args_sections_describe_parameters_too() -> None:
    @tool
    def both(a: int, *, b: int, c: int) -> int:
        """Both.

        Args:
            a: the a.

        Keyword Args:
            b: the b.

        Keyword Arguments:
            c: the c.
        """
        return 0

    assert {name: node["description"] for name, node in both.parameters["properties"].items()} == {
        "a": "the a.",
        "b": "the b.",
        "c": "the c.",
    }


def _documented(doc: str) -> Any:
    def documented(a: int, b: int) -> int:
        return 0

    documented.__doc__ = doc
    return documented


@pytest.mark.parametrize("header", ["Warning", "Note", "Example", "Raises", "Yields", "See Also", "Returns"])
def test_any_other_section_ends_the_arguments(header: str) -> None:
    documented = _documented(f"""Sectioned.

    Args:
        a: the a.
    {header}:
        b: never negative.
    """)
    assert _docstring(documented) == ("Sectioned.", {"a": "the a."})  # no argument named after the header
    sectioned = tool(documented)
    assert sectioned.description == "Sectioned."
    assert "description" not in sectioned.parameters["properties"]["b"]


@pytest.mark.parametrize("header", ["Warning", "Note", "Example", "Raises", "Yields"])
def test_a_section_inside_the_arguments_is_not_an_argument(header: str) -> None:
    documented = _documented(f"""Sectioned.

    Args:
        a: the a.
            More about a.
        {header}:
            b: never negative.

    Args:
        b: the b.
    """)
    assert _docstring(documented) == ("Sectioned.", {"a": "the a. More about a.", "b": "the b."})


def test_text_back_at_the_header_level_ends_the_arguments() -> None:
    def f(a: int) -> int:
        """Sum.

        Args:
            a: the a.
        Then a closing remark: not about a.
        """
        return a

    def g(a: int) -> int:
        """Args:
        a: the a, on a docstring whose first line is the header.
        """
        return a

    assert _docstring(f) == ("Sum.", {"a": "the a."})
    assert _docstring(g) == ("", {"a": "the a, on a docstring whose first line is the header."})


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Shade(enum.StrEnum):
    DARK = "dark"


@attrs.frozen
class Paint:
    color: Color
    level: Level = Level.LOW


@tool
async def paint(color: Color, level: Level = Level.HIGH, shade: Shade | None = None, coats: tuple[Paint, ...] = ()) -> Color:
    """Paints: returns the colour used."""
    assert type(color) is Color and type(level) is Level and (shade is None or type(shade) is Shade)
    assert all(type(coat.color) is Color and type(coat.level) is Level for coat in coats)
    return Color.BLUE if coats else color


def test_an_enum_is_the_enum_of_its_values_with_its_default_as_a_value() -> None:
    properties = thaw(paint.parameters)["properties"]
    assert properties["color"] == {"type": "string", "enum": ["red", "blue"]}
    assert properties["level"] == {"type": "integer", "enum": [1, 2], "default": 2}
    assert properties["shade"] == {"oneOf": [{"type": "string", "enum": ["dark"]}, {"type": "null"}], "default": None}
    coat = properties["coats"]["items"]["properties"]
    assert coat["level"] == {"type": "integer", "enum": [1, 2], "default": 1}
    assert thaw(paint.output.schema) == {"type": "string", "enum": ["red", "blue"]}


async def test_enum_arguments_arrive_as_members_and_a_returned_member_as_its_value() -> None:
    """An IntEnum or StrEnum reached the int or str hook and stayed a plain value."""
    runtime = make_runtime(paint)
    arguments = {"color": "red", "level": 1.0, "shade": "dark", "coats": [{"color": "red", "level": 2}]}
    assert expect_success(await runtime.execute(make_input("paint", arguments))).value == "blue"
    assert expect_success(await runtime.execute(make_input("paint", {"color": "red"}))).value == "red"
    for wrong, message in (
        ({"color": "RED"}, '"color" must be one of ["red","blue"]'),
        ({"color": "red", "level": 3}, '"level" must be one of [1,2]'),
        ({"color": "red", "level": True}, '"level" must be an integer'),
    ):
        failure = expect_failure(await runtime.execute(make_input("paint", wrong)))
        assert failure.code == "INVALID_ARGS" and message in failure.error.message


class Mixed(str, enum.Enum):  # noqa: UP042 - the mixin form, which StrEnum is not
    X = "x"


@attrs.frozen
class Swatch:
    shade: Shade
    mixed: Mixed
    level: Level
    inner: dict[str, Shade]


@tool
async def shades(shade: Shade = Shade.DARK, mixed: Mixed = Mixed.X) -> Swatch:
    """Returns the members it got, as fields of an attrs class and in a dict."""
    return Swatch(shade, mixed, Level.HIGH, {"again": shade})


@tool
def returned_member(shade: Shade) -> list[Shade]:
    """Returns the member it got."""
    return [shade]


async def test_a_member_of_an_enum_that_subclasses_str_is_returned_and_defaulted_as_its_value() -> None:
    """cattrs sent a StrEnum's member to str's pass-through: returning it failed, and so did its default."""
    runtime = make_runtime(shades, returned_member)
    value = expect_success(await runtime.execute(make_input("shades", {}))).value
    assert value == {"shade": "dark", "mixed": "x", "level": 2, "inner": {"again": "dark"}}
    assert type(value["shade"]) is str and type(value["mixed"]) is str and type(value["level"]) is int
    assert type(value["inner"]["again"]) is str
    assert thaw(shades.parameters)["properties"]["shade"] == {"type": "string", "enum": ["dark"], "default": "dark"}
    assert expect_success(await runtime.execute(make_input("returned_member", {"shade": "dark"}))).value == ("dark",)


class Loose(TypedDict):
    # This module does not import FrozenDict, which JsonValue names: evaluating the key failed here.
    anything: JsonValue


@tool
def json_values(value: JsonValue, items: list[JsonValue], table: dict[str, JsonValue] | None = None,
                loose: Loose | None = None) -> JsonValue:
    """Hands back what it got, whatever JSON it is."""
    return {"value": value, "items": items, "table": table, "loose": loose}  # type: ignore[dict-item]


async def test_json_value_annotations_take_any_json() -> None:
    """get_type_hints expands JsonValue's forward references, and the expanded Union was refused."""
    properties = thaw(json_values.parameters)["properties"]
    assert properties["value"] == {} and properties["items"] == {"type": "array", "items": {}}
    assert thaw(json_values.output.schema) == {}
    runtime = make_runtime(json_values)
    arguments = {"value": [1, {"a": None}], "items": ["x", 2.5, True], "table": {"k": [{}]}, "loose": {"anything": [[1]]}}
    assert expect_success(await runtime.execute(make_input("json_values", arguments))).value == arguments


def test_a_union_that_only_looks_like_json_value_is_still_refused() -> None:
    def f(v: bool | int | float | str | tuple[int, ...] | dict[str, int] | None) -> str:
        """Doc."""
        return ""

    with pytest.raises(SchemaSpecError, match="the union"):
        tool(f)


class Perm(enum.Flag):
    R = 1
    W = 2


class Empty(enum.Enum):
    pass


class Corner(enum.Enum):
    ORIGIN = (0, 0)


def test_enums_the_schema_cannot_say_are_refused() -> None:
    async def f(perm: Perm, empty: Empty, corner: Corner) -> None:
        """Doc."""

    with pytest.raises(SchemaSpecError) as refused:
        tool(f)
    message = str(refused.value)
    assert "f.perm: the flag enum Perm is not supported; use list[Perm] of a plain Enum" in message
    assert "f.empty: the enum Empty has no members: no value could be given" in message
    assert "f.corner: the value of Corner (0, 0) is not JSON (use str, int, bool or None values)" in message


class Blank(enum.Enum):
    NONE = None
    SOME = "some"


def test_an_optional_enum_with_a_none_member_is_refused_as_ambiguous() -> None:
    """null reached cattrs' Optional hook first: the body got None, the member was unreachable."""

    async def f(blank: Blank | None, blanks: list[Blank | None]) -> None:
        """Doc."""

    with pytest.raises(SchemaSpecError) as refused:
        tool(f)
    message = str(refused.value)
    assert "f.blank: " in message and "f.blanks[]: " in message
    assert "is ambiguous: null could be None or <Blank.NONE: None>, whose value is None; annotate Blank alone" in message


@tool
def blank(blank: Blank) -> str:
    """The enum alone: null is its member."""
    return repr(blank)


async def test_an_enum_with_a_none_member_takes_null_as_that_member() -> None:
    assert thaw(blank.parameters)["properties"]["blank"] == {
        "oneOf": [{"type": "null", "enum": [None]}, {"type": "string", "enum": ["some"]}]
    }
    runtime = make_runtime(blank)
    assert expect_success(await runtime.execute(make_input("blank", {"blank": None}))).value == "<Blank.NONE: None>"


FIRST_ROOM = uuid.UUID(int=1)


@attrs.frozen
class Meeting:
    at: datetime.datetime
    room: uuid.UUID = FIRST_ROOM


@tool
async def schedule(
    when: Annotated[datetime.datetime, "the start"],
    day: datetime.date = datetime.date(2026, 1, 2),
    folder: pathlib.Path = pathlib.Path("notes"),
    earlier: tuple[Meeting, ...] = (),
    alarm: datetime.time | None = None,
) -> Meeting:
    """Schedules a meeting a day after ``when``."""
    assert type(when) is datetime.datetime and type(day) is datetime.date and isinstance(folder, pathlib.Path)
    assert all(type(meeting.at) is datetime.datetime and type(meeting.room) is uuid.UUID for meeting in earlier)
    assert alarm is None or type(alarm) is datetime.time
    return Meeting(at=when + datetime.timedelta(days=1), room=uuid.UUID(int=len(earlier)))


def test_dates_uuids_and_paths_are_strings_whose_description_names_the_form() -> None:
    properties = thaw(schedule.parameters)["properties"]
    assert properties["when"] == {
        "type": "string",
        "description": "the start (an ISO 8601 date and time, e.g. 2026-12-05T16:30:00+00:00)",
    }
    assert properties["day"] == {
        "type": "string", "description": "an ISO 8601 date, e.g. 2026-12-05", "default": "2026-01-02"
    }  # fmt: skip
    assert properties["folder"] == {"type": "string", "description": "a file system path", "default": "notes"}
    room = properties["earlier"]["items"]["properties"]["room"]
    assert room["default"] == "00000000-0000-0000-0000-000000000001"
    assert properties["alarm"]["oneOf"][0] == {"type": "string", "description": "an ISO 8601 time, e.g. 16:30:00"}


async def test_date_uuid_and_path_arguments_arrive_parsed_and_a_returned_one_goes_back_as_text() -> None:
    runtime = make_runtime(schedule)
    arguments = {
        "when": "2026-12-05T16:30:00Z",
        "folder": "/tmp/x",
        "earlier": [{"at": "2026-01-01T00:00:00", "room": "123e4567-e89b-12d3-a456-426614174000"}],
        "alarm": "07:15",
    }
    value = thaw(expect_success(await runtime.execute(make_input("schedule", arguments))).value)
    assert value == {"at": "2026-12-06T16:30:00+00:00", "room": "00000000-0000-0000-0000-000000000001"}
    for wrong, message in (
        ({"when": "yesterday"}, 'expected an ISO 8601 date and time, got "yesterday" @ $.when'),
        ({"when": 5}, '"when" must be a string'),
        ({"when": "2026-12-05", "day": "2026-13-01"}, 'expected an ISO 8601 date, got "2026-13-01" @ $.day'),
        ({"when": "2026-12-05", "folder": ""}, 'expected a file system path, got "" @ $.folder'),
        ({"when": "2026-12-05", "folder": "a\0b"}, 'expected a file system path, got "a\\u0000b" @ $.folder'),
        ({"when": "2026-12-05", "earlier": [{"at": "2026-01-01", "room": "nope"}]}, 'expected a UUID, got "nope"'),
        # Only the standard text: uuid.UUID took these too, a truncated id becoming another, zero-padded one.
        *(
            ({"when": "2026-12-05", "earlier": [{"at": "2026-01-01", "room": text}]}, "expected a UUID")
            for text in (
                "  3e4567e89b12d3a4564266141740  ",
                "{123e4567-e89b-12d3-a456-426614174000}",
                "urn:uuid:123e4567-e89b-12d3-a456-426614174000",
                "123e4567e89b12d3a456426614174000",
                "123e4567-e89b-12d3-a456-４26614174000",
            )
        ),
    ):
        failure = expect_failure(await runtime.execute(make_input("schedule", wrong)))
        assert failure.code == "INVALID_ARGS" and message in failure.error.message, failure.error.message


async def test_a_returned_date_that_is_not_one_breaks_the_output_contract() -> None:
    @tool
    async def today() -> datetime.date:
        """The day, wrongly."""
        return "not a date"  # type: ignore[return-value]

    failure = expect_failure(await make_runtime(today).execute(make_input("today")))
    assert failure.code == "INVALID_TOOL_OUTPUT" and 'expected an ISO 8601 date, got "not a date"' in failure.error.message
