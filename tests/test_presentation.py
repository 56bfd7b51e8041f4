"""The presentation vocabulary: view classes, their checks and their strict camelCase wire form."""

from __future__ import annotations

import json
import math
from typing import Any

import attrs
import cattrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsh_core._content import ImageBlock, TextBlock
from dsh_core._errors import DshError, NonJsonValueError
from dsh_core.presentation import (
    DiffCallView,
    DiffResultView,
    FileDiff,
    FileLocation,
    GenericCallView,
    GenericResultView,
    PresentationError,
    ReadFileLine,
    ReadResultView,
    SearchFileMatches,
    SearchMatch,
    SearchResultView,
    TerminalCallView,
    TerminalResultView,
    WebResultView,
    WebSource,
    converter,
    structure_call_view,
    structure_result_view,
    unstructure_view,
)

# --- strategies ---------------------------------------------------------------------------

texts = st.text(max_size=12)
opt_texts = st.none() | texts
positive = st.integers(min_value=1, max_value=10**6)
counts = st.integers(min_value=0, max_value=10**6)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not (f == 0 and math.copysign(1, f) < 0))
    | texts
)
json_values = st.recursive(
    json_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3), max_leaves=8
)
blocks = st.builds(TextBlock, text=texts) | st.builds(ImageBlock, data=texts, mime_type=texts)
contents = st.none() | st.lists(blocks, max_size=3)
locations = st.builds(FileLocation, path=texts, line=st.none() | positive)
diffs = st.builds(FileDiff, path=texts, old_text=opt_texts, new_text=texts)
kinds = st.sampled_from(["read", "edit", "delete", "move", "search", "execute", "fetch", "other"])


def small_lists(elements: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    return st.lists(elements, max_size=3)


call_views = st.one_of(
    st.builds(
        GenericCallView,
        title=texts,
        kind=st.none() | kinds,
        raw_input=json_values,
        content=contents,
        locations=st.none() | small_lists(locations),
    ),
    st.builds(TerminalCallView, title=texts, description=opt_texts, cwd=opt_texts),
    st.builds(DiffCallView, title=texts, diffs=small_lists(diffs), locations=st.none() | small_lists(locations)),
)

search_matches = st.builds(
    SearchFileMatches,
    path=texts,
    matches=small_lists(st.builds(SearchMatch, line_number=positive, line=texts)),
)
web_sources = st.builds(WebSource, url=texts, title=opt_texts, snippet=opt_texts, published_at=opt_texts)

result_views = st.one_of(
    st.builds(GenericResultView, title=opt_texts, content=contents),
    st.builds(
        TerminalResultView,
        title=opt_texts,
        output=opt_texts,
        exit_code=st.none(),
        signal=opt_texts,
    ),
    st.builds(TerminalResultView, title=opt_texts, output=opt_texts, exit_code=st.integers(-255, 255)),
    st.builds(DiffResultView, title=opt_texts, diffs=small_lists(diffs)),
    st.builds(
        SearchResultView,
        shape=st.just("matches"),
        truncated=st.booleans(),
        total=counts,
        title=opt_texts,
        files=small_lists(search_matches),
    ),
    st.builds(
        SearchResultView,
        shape=st.just("paths"),
        truncated=st.booleans(),
        total=counts,
        title=opt_texts,
        paths=small_lists(texts),
    ),
    st.builds(
        ReadResultView,
        path=texts,
        offset=positive,
        lines=small_lists(st.builds(ReadFileLine, number=positive, text=texts)),
        total_lines=counts,
        title=opt_texts,
        lang=opt_texts,
        content=opt_texts,
    ),
    st.builds(
        WebResultView,
        kind=st.just("search"),
        truncated=st.booleans(),
        title=opt_texts,
        sources=small_lists(web_sources),
        answer=opt_texts,
    ),
    st.builds(
        WebResultView,
        kind=st.just("fetch"),
        truncated=st.booleans(),
        title=opt_texts,
        url=texts,
        status_code=st.integers(100, 599),
    ),
)


def plain_json_problems(value: object, path: str = "$") -> list[str]:
    """Where ``value`` is not made of plain dict/list/scalars, or carries a None that should be omitted."""
    problems: list[str] = []
    pending: list[tuple[object, str, bool]] = [(value, path, False)]
    while pending:
        item, where, inside_raw = pending.pop()
        if type(item) is dict:
            for key, child in item.items():
                if child is None and not inside_raw and key != "oldText":
                    problems.append(f"{where}.{key} is None instead of omitted")
                pending.append((child, f"{where}.{key}", inside_raw or key == "rawInput"))
        elif type(item) is list:
            pending.extend((child, f"{where}[{i}]", inside_raw) for i, child in enumerate(item))
        elif item is not None and type(item) not in (str, int, float, bool):
            problems.append(f"{where} is a {type(item).__name__}")
    return problems


# --- round trips --------------------------------------------------------------------------


@given(call_views)
def test_call_views_round_trip(view: Any) -> None:
    """Every pending view structures back from its wire form to an equal view."""
    assert view == structure_call_view(unstructure_view(view))


@given(result_views)
def test_result_views_round_trip(view: Any) -> None:
    """Every completed view structures back from its wire form to an equal view."""
    assert view == structure_result_view(unstructure_view(view))


@given(call_views | result_views)
def test_wire_form_is_plain_json_without_none(view: Any) -> None:
    """The wire form is plain JSON (no tuples, no FrozenDict), survives json.dumps, and omits absent fields."""
    data = unstructure_view(view)
    assert plain_json_problems(data) == []
    parse = (
        structure_call_view
        if type(view) in (GenericCallView, TerminalCallView, DiffCallView)
        else structure_result_view
    )
    assert view == parse(json.loads(json.dumps(data, allow_nan=False)))


# --- wire names ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("view", "expected"),
    [
        (
            GenericCallView(
                title="read a.txt",
                kind="read",
                raw_input={"path": "a.txt", "n": [1, None]},
                content=[TextBlock(text="hi"), ImageBlock(data="AAAA", mime_type="image/png")],
                locations=[FileLocation(path="a.txt", line=3)],
            ),
            {
                "card": "generic",
                "title": "read a.txt",
                "kind": "read",
                "rawInput": {"path": "a.txt", "n": [1, None]},
                "content": [{"type": "text", "text": "hi"}, {"type": "image", "data": "AAAA", "mimeType": "image/png"}],
                "locations": [{"path": "a.txt", "line": 3}],
            },
        ),
        (TerminalCallView(title="ls", cwd="/tmp"), {"card": "terminal", "title": "ls", "cwd": "/tmp"}),
        (
            DiffCallView(title="new", diffs=[FileDiff(path="b", old_text=None, new_text="x")]),
            {"card": "diff", "title": "new", "diffs": [{"path": "b", "oldText": None, "newText": "x"}]},
        ),
        (GenericResultView(), {"card": "generic"}),
        (TerminalResultView(output="ok\n", exit_code=0), {"card": "terminal", "output": "ok\n", "exitCode": 0}),
        (TerminalResultView(signal="SIGTERM"), {"card": "terminal", "signal": "SIGTERM"}),
        (
            DiffResultView(diffs=[FileDiff(path="b", old_text="a", new_text="x")]),
            {"card": "diff", "diffs": [{"path": "b", "oldText": "a", "newText": "x"}]},
        ),
        (
            SearchResultView(
                shape="matches",
                truncated=True,
                total=9,
                files=[SearchFileMatches(path="a", matches=[SearchMatch(line_number=4, line="foo")])],
            ),
            {
                "card": "search",
                "shape": "matches",
                "truncated": True,
                "total": 9,
                "files": [{"path": "a", "matches": [{"lineNumber": 4, "line": "foo"}]}],
            },
        ),
        (
            SearchResultView(shape="paths", truncated=False, total=1, paths=["a/b"]),
            {"card": "search", "shape": "paths", "truncated": False, "total": 1, "paths": ["a/b"]},
        ),
        (
            ReadResultView(
                path="a.py", offset=10, lines=[ReadFileLine(number=10, text="x = 1")], total_lines=20, lang="python"
            ),
            {
                "card": "read",
                "path": "a.py",
                "offset": 10,
                "lines": [{"number": 10, "text": "x = 1"}],
                "totalLines": 20,
                "lang": "python",
            },
        ),
        (
            WebResultView(
                kind="search", truncated=False, sources=[WebSource(url="https://x", published_at="2024-01-01")]
            ),
            {
                "card": "web",
                "kind": "search",
                "truncated": False,
                "sources": [{"url": "https://x", "publishedAt": "2024-01-01"}],
            },
        ),
        (
            WebResultView(kind="fetch", truncated=True, url="https://y", status_code=404),
            {"card": "web", "kind": "fetch", "truncated": True, "url": "https://y", "statusCode": 404},
        ),
    ],
)
def test_wire_names_are_camel_case(view: Any, expected: dict[str, Any]) -> None:
    """The wire form uses the seed's camelCase names, puts the tag first and leaves out absent fields."""
    data = unstructure_view(view)
    assert expected == data
    assert next(iter(data)) == "card"


# --- rejection ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("parse", "data", "expected"),
    [
        (
            structure_call_view,
            {"card": "zzz", "title": "x"},
            "unknown card 'zzz'; expected one of 'diff', 'generic', 'terminal' @ $.card",
        ),
        (
            structure_result_view,
            {"card": "zzz"},
            "unknown card 'zzz'; expected one of 'diff', 'generic', 'read', 'search', 'terminal', 'web' @ $.card",
        ),
        (structure_call_view, {"card": "search", "title": "x"}, "unknown card 'search'"),
        (structure_call_view, {"title": "x"}, "missing 'card' tag"),
        (structure_result_view, {"card": 3}, "unknown card 3"),
        (structure_result_view, ["card", "generic"], "expected object, got array @ $"),
    ],
)
def test_unknown_or_missing_card_is_rejected_clearly(parse: Any, data: object, expected: str) -> None:
    """A card outside the closed union is named in the error, with the cards that exist."""
    with pytest.raises(PresentationError) as info:
        parse(data)
    assert expected in str(info.value)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"card": "terminal", "title": "ls", "colour": "red"}, "unknown field(s): colour @ $"),
        ({"card": "generic", "title": "t", "raw_input": 1}, "unknown field(s): raw_input @ $"),
        (
            {"card": "diff", "title": "t", "diffs": [{"path": "a", "oldText": None, "newText": "b", "mode": 1}]},
            "unknown field(s): mode @ $.diffs[0]",
        ),
        (
            {"card": "generic", "title": "t", "content": [{"type": "text", "text": "a", "cache": True}]},
            "unknown field(s): cache @ $.content[0]",
        ),
    ],
)
def test_unknown_fields_are_rejected(data: dict[str, Any], expected: str) -> None:
    """Fields the vocabulary does not define (including snake_case spellings) are refused with their path."""
    with pytest.raises(PresentationError) as info:
        structure_call_view(data)
    assert expected in info.value.errors


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"card": "terminal", "exitCode": "1"}, "expected integer, got string @ $.exitCode"),
        ({"card": "terminal", "exitCode": True}, "expected integer, got boolean @ $.exitCode"),
        ({"card": "terminal", "exitCode": 1.0}, "expected integer, got number @ $.exitCode"),
        ({"card": "terminal", "title": 7}, "expected string, got integer @ $.title"),
        ({"card": "terminal", "output": ["a"]}, "expected string, got array @ $.output"),
        (
            {"card": "search", "shape": "paths", "truncated": 1, "total": 0, "paths": []},
            "expected boolean, got integer @ $.truncated",
        ),
        (
            {"card": "search", "shape": "paths", "truncated": "false", "total": 0, "paths": []},
            "expected boolean, got string @ $.truncated",
        ),
        (
            {"card": "search", "shape": "paths", "truncated": False, "total": 0, "paths": "abc"},
            "expected array, got string @ $.paths",
        ),
        (
            {"card": "read", "path": "a", "offset": 1, "lines": [{"number": "1", "text": "x"}], "totalLines": 1},
            "expected integer, got string @ $.lines[0].number",
        ),
        (
            {"card": "web", "kind": "crawl", "truncated": False},
            "expected one of 'search', 'fetch', got 'crawl' @ $.kind",
        ),
        ({"card": "diff", "diffs": [{"path": "a", "newText": "b"}]}, "required field missing @ $.diffs[0].oldText"),
    ],
)
def test_scalars_are_structured_strictly(data: dict[str, Any], expected: str) -> None:
    """No coercion: "1" is not an int, 1 is not a bool, a string is not an array."""
    with pytest.raises(PresentationError) as info:
        structure_result_view(data)
    assert expected in info.value.errors


def test_every_problem_is_reported_with_its_path() -> None:
    """One error lists all problems, so a bridge author fixes them in one go."""
    data = {
        "card": "generic",
        "title": 1,
        "kind": "nope",
        "rawInput": {"a": [math.nan]},
        "locations": [{"line": 1}, {"path": "b", "line": 0}],
    }
    with pytest.raises(PresentationError) as info:
        structure_call_view(data)
    assert list(info.value.errors) == [
        "expected string, got integer @ $.title",
        "expected one of 'read', 'edit', 'delete', 'move', 'search', 'execute', 'fetch', 'other', got 'nope' @ $.kind",
        "nan is not a finite JSON number (at $.a[0] within the value) @ $.rawInput",
        "required field missing @ $.locations[0].path",
        "FileLocation.line must be >= 1, got 0 @ $.locations[1]",
    ]


def test_presentation_error_is_a_value_error_with_a_code() -> None:
    """Callers can catch it as ValueError or DshError, and read a stable code."""
    with pytest.raises(ValueError) as info:
        structure_result_view({"card": "nope"})
    assert isinstance(info.value, DshError)
    assert info.value.code == "INVALID_PRESENTATION"
    assert str(info.value).startswith("invalid tool result view: ")


def test_unstructure_view_refuses_other_objects() -> None:
    """Only view classes have a view wire form."""
    with pytest.raises(TypeError, match="expected a tool call or result view"):
        unstructure_view(FileDiff(path="a", old_text=None, new_text="b"))  # type: ignore[arg-type]


def test_converter_handles_the_shared_file_vocabulary() -> None:
    """The public converter (un)structures the non-view classes too."""
    diff = FileDiff(path="a", old_text=None, new_text="b")
    assert converter.unstructure(diff) == {"path": "a", "oldText": None, "newText": "b"}
    assert diff == converter.structure({"path": "a", "oldText": None, "newText": "b"}, FileDiff)


def test_a_view_structures_from_its_own_class_only_with_its_card() -> None:
    """Structuring straight into a class still checks the card tag."""
    with pytest.raises(cattrs.ClassValidationError) as info:
        converter.structure({"card": "diff", "title": "x"}, TerminalCallView)
    assert str(info.value.exceptions[0]) == "unknown card 'diff'; expected one of 'terminal'"
    assert TerminalCallView(title="x") == converter.structure({"card": "terminal", "title": "x"}, TerminalCallView)


# --- construction checks ------------------------------------------------------------------


def test_exit_code_and_signal_are_exclusive() -> None:
    """A process either exited or was killed."""
    with pytest.raises(ValueError, match="mutually exclusive"):
        TerminalResultView(exit_code=1, signal="SIGKILL")
    with pytest.raises(PresentationError, match="mutually exclusive"):
        structure_result_view({"card": "terminal", "exitCode": 1, "signal": "SIGKILL"})


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (lambda: GenericCallView(title=1), TypeError, "GenericCallView.title must be a str, got int"),
        (lambda: GenericCallView(title="t", kind="walk"), ValueError, "GenericCallView.kind must be one of"),
        (lambda: GenericCallView(title="t", raw_input={1: 2}), NonJsonValueError, "object key 1 is not a str"),
        (lambda: GenericCallView(title="t", content=["hi"]), TypeError, "content[0] must be a TextBlock or ImageBlock"),
        (lambda: GenericCallView(title="t", locations="a.txt"), TypeError, "locations must be a list of FileLocation"),
        (lambda: FileLocation(path="a", line=0), ValueError, "FileLocation.line must be >= 1"),
        (lambda: FileLocation(path="a", line=True), TypeError, "FileLocation.line must be an int or None, got bool"),
        (lambda: FileDiff(path="a", old_text=1, new_text="b"), TypeError, "FileDiff.old_text must be a str or None"),
        (
            lambda: DiffCallView(title="t", diffs=[{"path": "a"}]),
            TypeError,
            "DiffCallView.diffs[0] must be a FileDiff, got dict",
        ),
        (lambda: ReadFileLine(number=0, text=""), ValueError, "ReadFileLine.number must be >= 1"),
        (lambda: TerminalResultView(exit_code="0"), TypeError, "TerminalResultView.exit_code must be an int or None"),
        (
            lambda: SearchResultView(shape="paths", truncated=0, total=0, paths=[]),
            TypeError,
            "truncated must be a bool",
        ),
        (
            lambda: SearchResultView(shape="paths", truncated=False, total=-1, paths=[]),
            ValueError,
            "total must be >= 0",
        ),
        (lambda: SearchResultView(shape="paths", truncated=False, total=0), ValueError, "paths is required"),
        (
            lambda: SearchResultView(shape="paths", truncated=False, total=0, paths=[], files=[]),
            ValueError,
            'files must be None when shape is "paths"',
        ),
        (lambda: SearchResultView(shape="matches", truncated=False, total=0), ValueError, "files is required"),
        (
            lambda: SearchResultView(shape="paths", truncated=False, total=0, paths=[1]),
            TypeError,
            "paths[0] must be a str",
        ),
        (lambda: WebResultView(kind="fetch", truncated=False, url="u"), ValueError, "status_code is required"),
        (lambda: WebResultView(kind="fetch", truncated=False, url="u", status_code=700), ValueError, "100-599"),
        (
            lambda: WebResultView(kind="search", truncated=False, sources=[], url="u"),
            ValueError,
            'url must be None when kind is "search"',
        ),
        (
            lambda: WebResultView(kind="fetch", truncated=False, url="u", status_code=200, answer="a"),
            ValueError,
            'answer must be None when kind is "fetch"',
        ),
        (lambda: ReadResultView(path="a", offset=0, lines=[], total_lines=0), ValueError, "offset must be >= 1"),
    ],
)
def test_fields_are_checked_at_construction(build: Any, error: type[Exception], message: str) -> None:
    """A view that exists is valid: wrong types, ranges and variant fields fail at construction."""
    with pytest.raises(error) as info:
        build()
    assert message in str(info.value)


def test_sequences_are_frozen_as_tuples_and_views_are_immutable() -> None:
    """Lists given to a view become tuples, raw input becomes frozen JSON, and fields cannot be reassigned."""
    view = GenericCallView(title="t", raw_input={"a": [1]}, locations=[FileLocation(path="p")], content=[])
    assert (FileLocation(path="p"),) == view.locations
    assert view.content == ()
    assert view.raw_input["a"] == (1,)  # type: ignore[index]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        view.title = "u"  # type: ignore[misc]
    assert hash(view) == hash(
        GenericCallView(title="t", raw_input={"a": [1]}, locations=[FileLocation(path="p")], content=[])
    )


def test_card_is_fixed() -> None:
    """The card tag is not a constructor argument, so a view cannot lie about its kind."""
    assert SearchResultView(shape="paths", truncated=False, total=0, paths=[]).card == "search"
    with pytest.raises(TypeError):
        TerminalCallView(title="ls", card="diff")  # type: ignore[call-arg]


@pytest.mark.parametrize(
    "cls",
    [
        FileLocation,
        FileDiff,
        ReadFileLine,
        SearchMatch,
        SearchFileMatches,
        WebSource,
        GenericCallView,
        TerminalCallView,
        DiffCallView,
        GenericResultView,
        TerminalResultView,
        DiffResultView,
        SearchResultView,
        ReadResultView,
        WebResultView,
    ],
)
def test_vocabulary_classes_are_final_and_keyword_only(cls: type) -> None:
    """The union is closed: view classes are not meant to be subclassed, and every field is keyword-only."""
    assert getattr(cls, "__final__", False)
    assert all(field.kw_only for field in attrs.fields(cls) if field.init)


def _deep_list(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {"card": "generic", "title": "t", "kind": _deep_list(100_000)},
            "expected one of 'read', 'edit', 'delete', 'move', 'search', 'execute', 'fetch', 'other', got <array> @ $.kind",
        ),
        ({"card": _deep_list(100_000), "title": "t"}, "unknown card <array>; expected one of"),
        (
            {"card": "generic", "title": "t", "kind": "x" * 5_000_000},
            "expected one of 'read', 'edit', 'delete', 'move', 'search', 'execute', 'fetch', 'other', got '"
            + "x" * 40
            + "'… (5000000 characters) @ $.kind",
        ),
    ],
    ids=["deep-literal", "deep-card", "huge-literal"],
)
def test_a_wrong_value_is_named_by_its_type_or_a_short_repr(data: dict[str, Any], expected: str) -> None:
    with pytest.raises(PresentationError) as info:
        structure_call_view(data)
    (error,) = info.value.errors
    assert expected in error
    assert len(str(info.value)) < 300


def test_a_wrongly_typed_literal_fails_construction_with_its_type() -> None:
    with pytest.raises(ValueError, match=r"GenericCallView.kind must be one of .*, got <array>$"):
        GenericCallView(title="t", kind=_deep_list(100_000))
    with pytest.raises(ValueError) as info:
        GenericCallView(title="t", kind="x" * 5_000_000)
    assert str(info.value).endswith("'… (5000000 characters)") and len(str(info.value)) < 300


def test_a_failed_value_check_is_reported_for_its_object_and_stops_there() -> None:
    """What PresentationError documents: the first failed check of an object, at the object's path."""
    data = {"card": "read", "path": "p", "offset": 0, "lines": [{"number": 0, "text": "a"}], "totalLines": -1}
    with pytest.raises(PresentationError) as info:
        structure_result_view(data)
    assert info.value.errors == ("ReadFileLine.number must be >= 1, got 0 @ $.lines[0]",)


def _apply_hunks(old: list[str], hunks: list[str]) -> list[str]:
    """``old`` with ``hunks`` applied as ``patch`` would, checking every context and removed line."""
    import re

    out: list[str] = []
    position = 0
    for line in hunks:
        header = re.fullmatch(r"@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@", line)
        if header:
            start, length = int(header[1]), int(header[2] or 1)
            begin = start - 1 if length else start
            out.extend(old[position:begin])
            position = begin
        elif line[0] in " -":
            assert old[position] == line[1:], (position, line)
            position += 1
            if line[0] == " ":
                out.append(line[1:])
        else:
            assert line[0] == "+", line
            out.append(line[1:])
    return out + old[position:]


lines_of = st.lists(st.sampled_from(["a", "b", "c", "", "a b"]), max_size=40)


@given(old=lines_of, edits=st.lists(st.tuples(st.integers(0, 40), st.sampled_from(["x", "a", None])), max_size=6))
def test_diff_hunks_turn_the_old_text_into_the_new_one(old: list[str], edits: list[tuple[int, str | None]]) -> None:
    from dsh_core.presentation import diff_hunks

    new = list(old)
    for at, text in edits:
        if text is None:
            if new:
                del new[at % len(new)]
        else:
            new.insert(at % (len(new) + 1), text)
    old_text, new_text = "".join(f"{line}\n" for line in old), "".join(f"{line}\n" for line in new)
    hunks = diff_hunks(old_text, new_text, compare_lines=10**6)
    assert _apply_hunks(old, hunks) == new
    assert (hunks == []) == (old == new)


def test_diff_hunks_bound_only_the_changed_stretch() -> None:
    from dsh_core.presentation import DIFF_COMPARE_LINES, diff_hunks

    shared = [f"same {n}" for n in range(3 * DIFF_COMPARE_LINES)]
    old = "\n".join([*shared, *(f"old {n}" for n in range(10)), *shared])
    new = "\n".join([*shared, *(f"new {n}" for n in range(12)), *shared])
    hunks = diff_hunks(old, new)
    assert hunks[0] == f"@@ -{len(shared) - 2},16 +{len(shared) - 2},18 @@"
    assert _apply_hunks(old.split("\n"), hunks) == new.split("\n")
    many = "\n".join(f"x{n}" for n in range(DIFF_COMPARE_LINES + 1))
    assert diff_hunks("", many)[0] == f"@@ -0,0 +1,{DIFF_COMPARE_LINES + 1} @@ too long to compare line by line: the start of each side"
    assert diff_hunks("", many, side_lines=2)[1:] == ["+x0", "+x1", f"... {DIFF_COMPARE_LINES - 1} more added lines"]


@pytest.mark.parametrize(
    ("old", "new", "hunks"),
    [
        ("#DISABLED", "#DISABLED\n", ["@@ -1 +1 @@", "-#DISABLED", "\\ No newline at end of file", "+#DISABLED"]),
        ("a\nb\n", "a\nb", ["@@ -2 +2 @@", "-b", "+b", "\\ No newline at end of file"]),
        ("same\n", "same\n", []),
        ("", "", []),
    ],
)
def test_a_change_of_the_final_newline_alone_is_a_hunk(old: str, new: str, hunks: list[str]) -> None:
    """It read as no change: an approval card called an edit of "#x" to "#x\\n" (uncommenting a command) unchanged."""
    from dsh_core.presentation import diff_hunks

    assert diff_hunks(old, new) == hunks
