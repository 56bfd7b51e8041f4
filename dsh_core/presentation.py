"""How a tool call looks in a UI: card-tagged render intents and their wire format.

A presenter returns a *view*, not pixels: an editor bridge turns a
``TerminalCallView`` into a terminal card, a CLI into a log line, and a UI that
knows neither falls back to the raw result content. Pending views
(:data:`ToolCallView`) describe a call before it runs; completed views
(:data:`ToolResultView`) replace them once it has settled. Search and web
results have no pending card: their structure exists only after the body ran.

Every class is a frozen, keyword-only attrs class that checks its fields when
it is constructed, so a view that exists is a valid view. Sequences are stored
as tuples (lists are accepted and frozen). ``None`` means "absent" and is left
out of the wire form, with one exception: :class:`FileDiff`'s ``oldText`` is
always written, ``null`` for a new file or a blind overwrite (the original
vocabulary's ``oldText: string | null``), and a diff without it is refused.

:data:`converter` is the one cattrs converter of this boundary. Its wire form
uses the camelCase names of the original vocabulary (``rawInput``, ``oldText``,
``exitCode``, ``totalLines``, ...), tags each view with ``card`` and each content
block with ``type``, and structures strictly: no scalar coercion (``"1"`` is
not an int, ``1`` is not a bool), no unknown fields, no unknown cards. Use
:func:`structure_call_view`, :func:`structure_result_view` and
:func:`unstructure_view`; failures raise :class:`PresentationError` listing
the problems found (see there for which).

Design choice: ``SearchResultView`` and ``WebResultView`` are one class each,
with ``shape`` / ``kind`` as an inner discriminant and a construction check that
exactly the fields of that variant are present. This mirrors the wire shape one
to one, keeps one class per ``card`` (the closed card union stays a flat list),
and lets ``match`` select a variant with ``case SearchResultView(shape="paths")``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias, final, get_args

import attrs
import cattrs
from cattrs.errors import AttributeValidationNote, ClassValidationError, ForbiddenExtraKeysError
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from ._content import ContentBlock, ImageBlock, TextBlock, as_content
from ._diff_hunks import DIFF_COMPARE_LINES, diff_hunks, text_lines
from ._errors import DshError, NonJsonValueError

if TYPE_CHECKING:
    from ._definition import ToolDefinition
from ._json import FrozenDict, JsonValue, snapshot_json, thaw
from ._terminal_text import clipped, json_printable, printable

__all__ = [
    "DIFF_COMPARE_LINES",
    "UNREAD_OLD_TEXT",
    "DiffCallView",
    "DiffResultView",
    "FileDiff",
    "FileLocation",
    "GenericCallView",
    "GenericResultView",
    "PresentationError",
    "ReadFileLine",
    "ReadResultView",
    "SearchFileMatches",
    "SearchMatch",
    "SearchResultView",
    "TerminalCallView",
    "TerminalResultView",
    "ToolCallKind",
    "ToolCallView",
    "ToolResultView",
    "WebResultView",
    "WebSource",
    "clipped",
    "converter",
    "declared_effects",
    "diff_hunks",
    "json_printable",
    "printable",
    "structure_call_view",
    "structure_result_view",
    "text_lines",
    "unstructure_view",
]

ToolCallKind: TypeAlias = Literal["read", "edit", "delete", "move", "search", "execute", "fetch", "other"]
"""What a call does to the world; picks the icon of a generic card (absent means ``"other"``)."""

# cattrs resolves field annotations at runtime; JsonValue names FrozenDict by a forward reference.
_RUNTIME_NAMES = (FrozenDict,)
_Validator: TypeAlias = Callable[[Any, "attrs.Attribute[Any]", Any], None]


class PresentationError(DshError, ValueError):
    """A view's wire form could not be structured.

    ``errors`` lists the problems found as ``"<what was wrong> @ <JSON path>"``;
    ``str()`` joins them. Every missing, unknown or wrongly typed field of the
    document is listed, each at its own path (``$.lines[0].number``). A value
    check that runs when an object is built (a range such as ``number >= 1``,
    fields that go together) is listed at the path of that object, naming the
    class and field (``ReadFileLine.number must be >= 1, got 0 @ $.lines[0]``),
    and runs only once all of that object's fields have the right types: only
    the first failing check of an object is reported, and an object holding a
    bad part is not checked itself, so fixing these may reveal more.
    """

    code = "INVALID_PRESENTATION"

    def __init__(self, what: str, errors: Sequence[str]) -> None:
        self.errors: tuple[str, ...] = tuple(errors)
        super().__init__(f"invalid {what}: " + "; ".join(self.errors))


# --- construction checks ------------------------------------------------------------------


def _where(instance: object, attribute: attrs.Attribute[Any]) -> str:
    return f"{type(instance).__name__}.{attribute.name}"


def _exact(kind: type, *, optional: bool = False, minimum: int | None = None) -> _Validator:
    """Check ``type(value) is kind`` (so ``True`` is not an int), optionally ``None`` or ``>= minimum``."""

    def check(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if value is None and optional:
            return
        if type(value) is not kind:
            article = "an" if kind.__name__[0] in "aeiou" else "a"
            expected = f"{article} {kind.__name__}" + (" or None" if optional else "")
            raise TypeError(f"{_where(instance, attribute)} must be {expected}, got {type(value).__name__}")
        if minimum is not None and value < minimum:  # type: ignore[operator]
            raise ValueError(f"{_where(instance, attribute)} must be >= {minimum}, got {value!r}")

    return check


# How much of a wrong string an error message quotes.
_QUOTED_CHARS = 40


def _shown(value: object) -> str:
    """A wrong value for an error message, short whatever it is.

    A string's repr cut to a readable length, a bool, a float or a small int
    as written; anything else (an array or object maybe nested past repr's
    recursion limit, an int of thousands of digits) as ``<its JSON type>``.
    """
    if type(value) is str:
        if len(value) <= _QUOTED_CHARS:
            return repr(value)
        return f"{value[:_QUOTED_CHARS]!r}… ({len(value)} characters)"
    if value is None or type(value) in (bool, float) or (isinstance(value, int) and abs(value) < 10**18):
        return repr(value)
    return f"<{_json_type(value)}>"


def _one_of(alias: Any, *, optional: bool = False) -> _Validator:
    allowed: tuple[str, ...] = get_args(alias)

    def check(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if value is None and optional:
            return
        if type(value) is not str or value not in allowed:
            choices = ", ".join(repr(a) for a in allowed)
            raise ValueError(f"{_where(instance, attribute)} must be one of {choices}, got {_shown(value)}")

    return check


def _tuple_of(kind: type, *, optional: bool = False) -> _Validator:
    def check(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if value is None and optional:
            return
        if type(value) is not tuple:
            raise TypeError(
                f"{_where(instance, attribute)} must be a list of {kind.__name__}, got {type(value).__name__}"
            )
        for index, item in enumerate(value):
            if type(item) is not kind:
                raise TypeError(
                    f"{_where(instance, attribute)}[{index}] must be a {kind.__name__}, got {type(item).__name__}"
                )

    return check


def _freeze(value: Any) -> Any:
    """Store a list as a tuple; anything else is left for the validator to judge."""
    return tuple(value) if type(value) is list else value


def _optional_content(value: Any) -> tuple[ContentBlock, ...] | None:
    return None if value is None else as_content(value)


def _require(view: object, present: Sequence[str], absent: Sequence[str], because: str) -> None:
    for name in present:
        if getattr(view, name) is None:
            raise ValueError(f"{type(view).__name__}.{name} is required when {because}")
    for name in absent:
        if getattr(view, name) is not None:
            raise ValueError(f"{type(view).__name__}.{name} must be None when {because}")


_str = _exact(str)
_opt_str = _exact(str, optional=True)
_bool = _exact(bool)


# --- shared file vocabulary ---------------------------------------------------------------


@final
@attrs.frozen(kw_only=True, slots=True)
class FileLocation:
    """A file a call reads or changes, optionally at a 1-based ``line``, for follow-along in an editor."""

    path: str = attrs.field(validator=_str)
    line: int | None = attrs.field(default=None, validator=_exact(int, optional=True, minimum=1))


@final
@attrs.frozen(kw_only=True, slots=True)
class FileDiff:
    """A whole-file or hunk change of ``path``; ``old_text`` is ``None`` for a new file or a blind overwrite."""

    path: str = attrs.field(validator=_str)
    old_text: str | None = attrs.field(validator=_opt_str)
    new_text: str = attrs.field(validator=_str)


UNREAD_OLD_TEXT: Final = "(current contents not read: a new file, or replaced whole)"
"""What a diff names as its old side when a :class:`FileDiff` has no ``old_text``.

Not ``/dev/null``: with no before-image the change may be a blind overwrite, and
a new-file header would tell whoever reads the diff that nothing is there to lose.
The approval question and ``replay`` show it alike.
"""


@final
@attrs.frozen(kw_only=True, slots=True)
class ReadFileLine:
    """One line of a read window: its 1-based file line ``number`` and its ``text`` without the newline."""

    number: int = attrs.field(validator=_exact(int, minimum=1))
    text: str = attrs.field(validator=_str)


@final
@attrs.frozen(kw_only=True, slots=True)
class SearchMatch:
    """One matching line of a content search, at 1-based ``line_number``."""

    line_number: int = attrs.field(validator=_exact(int, minimum=1))
    line: str = attrs.field(validator=_str)


@final
@attrs.frozen(kw_only=True, slots=True)
class SearchFileMatches:
    """The matches found in one file, in the order they were found."""

    path: str = attrs.field(validator=_str)
    matches: tuple[SearchMatch, ...] = attrs.field(converter=_freeze, validator=_tuple_of(SearchMatch))


@final
@attrs.frozen(kw_only=True, slots=True)
class WebSource:
    """One source of a web search: its ``url`` and what the search engine said about it."""

    url: str = attrs.field(validator=_str)
    title: str | None = attrs.field(default=None, validator=_opt_str)
    snippet: str | None = attrs.field(default=None, validator=_opt_str)
    published_at: str | None = attrs.field(default=None, validator=_opt_str)


# --- pending views (before the call runs) -------------------------------------------------


@final
@attrs.frozen(kw_only=True, slots=True)
class GenericCallView:
    """The default pending card: a short ``title``, an icon ``kind`` and optional detail.

    ``raw_input`` is any JSON value (a UI shows a string as is and anything else
    as pretty JSON); ``content`` is blocks to show instead; ``locations`` are the
    files the call touches.
    """

    card: Literal["generic"] = attrs.field(default="generic", init=False)
    title: str = attrs.field(validator=_str)
    kind: ToolCallKind | None = attrs.field(default=None, validator=_one_of(ToolCallKind, optional=True))
    raw_input: JsonValue = attrs.field(default=None, converter=snapshot_json)
    content: tuple[ContentBlock, ...] | None = attrs.field(default=None, converter=_optional_content)
    locations: tuple[FileLocation, ...] | None = attrs.field(
        default=None, converter=_freeze, validator=_tuple_of(FileLocation, optional=True)
    )


@final
@attrs.frozen(kw_only=True, slots=True)
class TerminalCallView:
    """A shell command about to run: ``title`` is the command line.

    ``description`` is one line shown above the card; ``cwd`` is shown as is when
    absolute, resolved against the session workspace when relative, and means
    the workspace when absent.
    """

    card: Literal["terminal"] = attrs.field(default="terminal", init=False)
    title: str = attrs.field(validator=_str)
    description: str | None = attrs.field(default=None, validator=_opt_str)
    cwd: str | None = attrs.field(default=None, validator=_opt_str)


@final
@attrs.frozen(kw_only=True, slots=True)
class DiffCallView:
    """A file creation or change about to happen, shown as inline diffs."""

    card: Literal["diff"] = attrs.field(default="diff", init=False)
    title: str = attrs.field(validator=_str)
    diffs: tuple[FileDiff, ...] = attrs.field(converter=_freeze, validator=_tuple_of(FileDiff))
    locations: tuple[FileLocation, ...] | None = attrs.field(
        default=None, converter=_freeze, validator=_tuple_of(FileLocation, optional=True)
    )


# --- completed views (replace the pending view) -------------------------------------------


@final
@attrs.frozen(kw_only=True, slots=True)
class GenericResultView:
    """The default completed card; an absent ``title`` keeps the pending title, absent ``content`` shows the raw result."""

    card: Literal["generic"] = attrs.field(default="generic", init=False)
    title: str | None = attrs.field(default=None, validator=_opt_str)
    content: tuple[ContentBlock, ...] | None = attrs.field(default=None, converter=_optional_content)


@final
@attrs.frozen(kw_only=True, slots=True)
class TerminalResultView:
    """A finished command: its captured ``output`` and how it ended.

    ``exit_code`` is set when the process exited and ``signal`` (e.g.
    ``"SIGTERM"``) when it was killed; never both.
    """

    card: Literal["terminal"] = attrs.field(default="terminal", init=False)
    title: str | None = attrs.field(default=None, validator=_opt_str)
    output: str | None = attrs.field(default=None, validator=_opt_str)
    exit_code: int | None = attrs.field(default=None, validator=_exact(int, optional=True))
    signal: str | None = attrs.field(default=None, validator=_opt_str)

    def __attrs_post_init__(self) -> None:
        if self.exit_code is not None and self.signal is not None:
            raise ValueError("TerminalResultView.exit_code and .signal are mutually exclusive")


@final
@attrs.frozen(kw_only=True, slots=True)
class DiffResultView:
    """The changes a finished edit made: applied hunks with context, or a whole-file diff without a before-image."""

    card: Literal["diff"] = attrs.field(default="diff", init=False)
    title: str | None = attrs.field(default=None, validator=_opt_str)
    diffs: tuple[FileDiff, ...] = attrs.field(converter=_freeze, validator=_tuple_of(FileDiff))


@final
@attrs.frozen(kw_only=True, slots=True)
class SearchResultView:
    """A finished exploratory search, without the result text.

    ``shape="matches"`` (grep) carries ``files``, the matches grouped by file in
    first-seen order; ``shape="paths"`` (glob) carries ``paths``. The other field
    must be ``None``. ``truncated`` and ``total`` say whether the inline results
    hit a cap, so a UI never shows a partial list as complete.
    """

    card: Literal["search"] = attrs.field(default="search", init=False)
    shape: Literal["matches", "paths"] = attrs.field(validator=_one_of(Literal["matches", "paths"]))
    truncated: bool = attrs.field(validator=_bool)
    total: int = attrs.field(validator=_exact(int, minimum=0))
    title: str | None = attrs.field(default=None, validator=_opt_str)
    files: tuple[SearchFileMatches, ...] | None = attrs.field(
        default=None, converter=_freeze, validator=_tuple_of(SearchFileMatches, optional=True)
    )
    paths: tuple[str, ...] | None = attrs.field(
        default=None, converter=_freeze, validator=_tuple_of(str, optional=True)
    )

    def __attrs_post_init__(self) -> None:
        if self.shape == "matches":
            _require(self, ["files"], ["paths"], 'shape is "matches"')
        else:
            _require(self, ["paths"], ["files"], 'shape is "paths"')


@final
@attrs.frozen(kw_only=True, slots=True)
class ReadResultView:
    """A finished file read, shown as numbered (optionally highlighted) code.

    ``offset`` is the requested 1-based first line and is kept even when
    ``lines`` is empty; ``lang`` is a language hint from the extension;
    ``content`` is the envelope-stripped text for UIs without a read card.
    """

    card: Literal["read"] = attrs.field(default="read", init=False)
    path: str = attrs.field(validator=_str)
    offset: int = attrs.field(validator=_exact(int, minimum=1))
    lines: tuple[ReadFileLine, ...] = attrs.field(converter=_freeze, validator=_tuple_of(ReadFileLine))
    total_lines: int = attrs.field(validator=_exact(int, minimum=0))
    title: str | None = attrs.field(default=None, validator=_opt_str)
    lang: str | None = attrs.field(default=None, validator=_opt_str)
    content: str | None = attrs.field(default=None, validator=_opt_str)


@final
@attrs.frozen(kw_only=True, slots=True)
class WebResultView:
    """A finished web access, without the page body.

    ``kind="search"`` carries ``sources`` and optionally ``answer``;
    ``kind="fetch"`` carries the final ``url`` (after redirects) and
    ``status_code``. The other variant's fields must be ``None``.
    """

    card: Literal["web"] = attrs.field(default="web", init=False)
    kind: Literal["search", "fetch"] = attrs.field(validator=_one_of(Literal["search", "fetch"]))
    truncated: bool = attrs.field(validator=_bool)
    title: str | None = attrs.field(default=None, validator=_opt_str)
    sources: tuple[WebSource, ...] | None = attrs.field(
        default=None, converter=_freeze, validator=_tuple_of(WebSource, optional=True)
    )
    answer: str | None = attrs.field(default=None, validator=_opt_str)
    url: str | None = attrs.field(default=None, validator=_opt_str)
    status_code: int | None = attrs.field(default=None, validator=_exact(int, optional=True, minimum=100))

    def __attrs_post_init__(self) -> None:
        if self.status_code is not None and self.status_code > 599:
            raise ValueError(f"WebResultView.status_code must be an HTTP status (100-599), got {self.status_code}")
        if self.kind == "search":
            _require(self, ["sources"], ["url", "status_code"], 'kind is "search"')
        else:
            _require(self, ["url", "status_code"], ["sources", "answer"], 'kind is "fetch"')


ToolCallView: TypeAlias = GenericCallView | TerminalCallView | DiffCallView
"""A pending view, as returned by a tool's call presenter; ``card`` tells them apart."""

ToolResultView: TypeAlias = (
    GenericResultView | TerminalResultView | DiffResultView | SearchResultView | ReadResultView | WebResultView
)
"""A completed view, as returned by a tool's result presenter; ``card`` tells them apart."""

_CALL_CARDS: dict[str, type[Any]] = {"generic": GenericCallView, "terminal": TerminalCallView, "diff": DiffCallView}
_RESULT_CARDS: dict[str, type[Any]] = {
    "generic": GenericResultView,
    "terminal": TerminalResultView,
    "diff": DiffResultView,
    "search": SearchResultView,
    "read": ReadResultView,
    "web": WebResultView,
}
_BLOCK_TYPES: dict[str, type[Any]] = {"text": TextBlock, "image": ImageBlock}
_VALUE_CLASSES = (FileLocation, FileDiff, ReadFileLine, SearchMatch, SearchFileMatches, WebSource)


# --- the converter ------------------------------------------------------------------------


class _WireError(ValueError):
    """A structuring problem whose message is already written for the user."""


def _json_type(value: object) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number"}
    if value is None:
        return "null"
    for kind, name in names.items():
        if isinstance(value, kind):
            return name
    return type(value).__name__


def _format_error(exc: BaseException, kind: type | None) -> str:
    if isinstance(exc, ForbiddenExtraKeysError):
        return "unknown field(s): " + ", ".join(sorted(exc.extra_fields))
    if isinstance(exc, KeyError):
        return "required field missing"
    if isinstance(exc, NonJsonValueError):
        problem = exc.message.removeprefix(f"{exc.path}: ")
        return problem if exc.path == "$" else f"{problem} (at {exc.path} within the value)"
    if isinstance(exc, (_WireError, TypeError, ValueError)):
        # Ours, snapshot_json's and the classes' own validators: all already say what is wrong.
        return str(exc)
    return cattrs.v.format_exception(exc, kind)


def _strict_scalar(kind: type) -> Callable[[Any, Any], Any]:
    expected = _json_type(kind())

    def structure(value: Any, _: Any) -> Any:
        if type(value) is not kind and not (kind is float and type(value) is int):
            raise _WireError(f"expected {expected}, got {_json_type(value)}")
        return value

    return structure


def _strict_literal(literal: Any) -> Callable[[Any, Any], Any]:
    allowed = get_args(literal)

    def structure(value: Any, _: Any) -> Any:
        if type(value) is not str or value not in allowed:
            raise _WireError(f"expected one of {', '.join(repr(a) for a in allowed)}, got {_shown(value)}")
        return value

    return structure


def _is_homogeneous_tuple(kind: Any) -> bool:
    args: tuple[Any, ...] = getattr(kind, "__args__", ())
    return getattr(kind, "__origin__", None) is tuple and len(args) == 2 and args[1] is Ellipsis


def _strict_array(kind: Any, conv: cattrs.Converter) -> Callable[[Any, Any], Any]:
    base = cattrs.cols.homogenous_tuple_structure_factory(kind, conv)

    def structure(value: Any, tp: Any) -> Any:
        # cattrs would happily turn a string into a tuple of characters.
        if type(value) is not list and type(value) is not tuple:
            raise _WireError(f"expected array, got {_json_type(value)}")
        return base(value, tp)

    return structure


def _tag_error(owner: str, tag: str, message: str) -> ClassValidationError:
    # Shaped like cattrs' own errors so transform_error reports it at ``$.<tag>``.
    error = _WireError(message)
    error.__notes__ = [AttributeValidationNote(f"Structuring {owner} @ attribute {tag}", tag, str)]
    return ClassValidationError(f"While structuring {owner}", [error], object)


def _read_tag(value: Any, owner: str, tag: str, known: Sequence[str]) -> str:
    if not isinstance(value, dict):
        raise _WireError(f"expected object, got {_json_type(value)}")
    if tag not in value:
        raise _tag_error(owner, tag, f"missing {tag!r} tag; expected one of {', '.join(map(repr, sorted(known)))}")
    found = value[tag]
    if type(found) is not str or found not in known:
        expected = ", ".join(map(repr, sorted(known)))
        raise _tag_error(owner, tag, f"unknown {tag} {_shown(found)}; expected one of {expected}")
    return found


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _register_class(conv: cattrs.Converter, cls: type[Any], tag: str | None) -> None:
    """Register strict, camelCase (un)structure hooks for ``cls``; ``tag`` names its init=False discriminant."""
    renames: dict[str, Any] = {}
    for field in attrs.fields(cls):
        if field.name == tag:
            continue
        wire = _camel(field.name)
        if field.name == "raw_input":
            renames[field.name] = override(rename=wire, struct_hook=lambda v, _: snapshot_json(v), unstruct_hook=thaw)
        elif wire != field.name:
            renames[field.name] = override(rename=wire)
    structure_fields = make_dict_structure_fn(cls, conv, _cattrs_forbid_extra_keys=True, **renames)
    unstructure_fields = make_dict_unstructure_fn(cls, conv, _cattrs_omit_if_default=True, **renames)
    tag_value = "" if tag is None else str(attrs.fields_dict(cls)[tag].default)

    def structure(value: Any, _: Any) -> Any:
        if not isinstance(value, dict):
            raise _WireError(f"expected object, got {_json_type(value)}")
        if tag is not None:
            _read_tag(value, cls.__name__, tag, [tag_value])
            value = {k: v for k, v in value.items() if k != tag}
        return structure_fields(value, cls)

    def unstructure(value: Any) -> dict[str, Any]:
        fields = unstructure_fields(value)
        # The tag goes first: a reader of the JSON sees what it is before its contents.
        return fields if tag is None else {tag: tag_value, **fields}

    conv.register_structure_hook(cls, structure)
    conv.register_unstructure_hook(cls, unstructure)


def _register_union(conv: cattrs.Converter, union: Any, name: str, tag: str, members: dict[str, type[Any]]) -> None:
    def structure(value: Any, _: Any) -> Any:
        return conv.structure(value, members[_read_tag(value, name, tag, list(members))])

    conv.register_structure_hook(union, structure)


def _configure_strict(conv: cattrs.Converter) -> None:
    """Make ``conv`` refuse every coercion of JSON scalars, literals and arrays."""
    for kind in (str, int, float, bool):
        conv.register_structure_hook(kind, _strict_scalar(kind))
    conv.register_structure_hook_factory(lambda t: getattr(t, "__origin__", None) is Literal, _strict_literal)
    conv.register_structure_hook_factory(_is_homogeneous_tuple, lambda t: _strict_array(t, conv))


def _configure_content(conv: cattrs.Converter) -> None:
    """Teach ``conv`` the wire form of content blocks: ``{"type": "text", "text": ...}`` and ``{"type": "image", ...}``."""
    for cls in _BLOCK_TYPES.values():
        _register_class(conv, cls, "type")
    _register_union(conv, ContentBlock, "content block", "type", _BLOCK_TYPES)


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True)
    _configure_strict(conv)
    _configure_content(conv)
    for cls in _VALUE_CLASSES:
        _register_class(conv, cls, None)
    for cls in (*_CALL_CARDS.values(), *_RESULT_CARDS.values()):
        _register_class(conv, cls, "card")
    _register_union(conv, ToolCallView, "tool call view", "card", _CALL_CARDS)
    _register_union(conv, ToolResultView, "tool result view", "card", _RESULT_CARDS)
    return conv


converter: cattrs.Converter = _make_converter()
"""The presentation boundary's converter, configured once (see the module docstring).

``converter.structure(data, FileDiff)`` and ``converter.unstructure(diff)`` work
for every class here; the views are better served by the functions below,
which turn failures into :class:`PresentationError`.
"""


_ATTRIBUTE_STEP = re.compile(r"\.([a-z][a-z0-9_]*)")


def _wire_path(message: str) -> str:
    # transform_error spells paths with attribute names; users know the wire names.
    text, sep, path = message.rpartition(" @ ")
    if not sep:
        return message
    return f"{text} @ " + _ATTRIBUTE_STEP.sub(lambda m: "." + _camel(m.group(1)), path)


def _structure(data: object, union: Any, what: str) -> Any:
    try:
        return converter.structure(data, union)
    except Exception as exc:
        errors = cattrs.transform_error(exc, "$", _format_error)
        raise PresentationError(what, [_wire_path(e) for e in errors]) from exc


def structure_call_view(data: object) -> ToolCallView:
    """Build a pending view from its wire form (a JSON object with a ``card`` tag).

    Raises:
        PresentationError: unknown or missing ``card``, unknown or missing fields,
            wrongly typed values or a failed field check, listed with their
            JSON paths (which ones: see :class:`PresentationError`).
    """
    view: ToolCallView = _structure(data, ToolCallView, "tool call view")
    return view


def structure_result_view(data: object) -> ToolResultView:
    """Build a completed view from its wire form (a JSON object with a ``card`` tag).

    Raises:
        PresentationError: as for :func:`structure_call_view`.
    """
    view: ToolResultView = _structure(data, ToolResultView, "tool result view")
    return view


def unstructure_view(view: ToolCallView | ToolResultView) -> dict[str, Any]:
    """The wire form of ``view``: a plain JSON-ready ``dict`` with camelCase keys and no ``None`` fields.

    Raises:
        TypeError: ``view`` is not one of the view classes.
    """
    if type(view) not in _VIEW_CLASSES:
        raise TypeError(f"expected a tool call or result view, got {type(view).__name__}")
    data: dict[str, Any] = converter.unstructure(view)
    return data


_VIEW_CLASSES = frozenset((*_CALL_CARDS.values(), *_RESULT_CARDS.values()))


def declared_effects(definition: ToolDefinition) -> str:
    """``effects: destructive, open world; can be undone``: what a tool declares about running it.

    For an approval question: its :class:`~dsh_core.ToolEffects` (``effects:
    none declared`` when it declares that it has none) and whether a call can
    be taken back (a ``revert``). ``""`` when the tool declares neither.
    """
    parts = []
    if definition.effects is not None:
        names = definition.effects.names
        parts.append("effects: " + (", ".join(name.replace("_", " ") for name in names) if names else "none declared"))
    if definition.revert is not None:
        parts.append("can be undone")
    return "; ".join(parts)

