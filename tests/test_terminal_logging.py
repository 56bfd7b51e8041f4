"""Log records the CLI prints when nothing is configured: escaped, and only when nothing is configured."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from dsh_core._terminal_logging import escaped_last_resort


@pytest.fixture
def unconfigured() -> Iterator[logging.Logger]:
    """A logger no handler reaches, so the last resort takes its records.

    It stops propagating (pytest's handlers sit on the root logger) only once the
    test runs: pytest also hooks a logger that does not propagate when a phase starts.
    """
    logger = logging.getLogger("dsh_core.test_terminal_logging")
    yield logger
    logger.propagate = True
    logger.handlers.clear()


def test_the_last_resort_escapes_while_a_command_runs_and_is_put_back_after(
    unconfigured: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    unconfigured.propagate = False
    before = logging.lastResort
    with escaped_last_resort():
        unconfigured.warning("tool %s listed", "x\x1b]0;owned\x07\nerror: forged")
        unconfigured.info("not shown below WARNING")
    assert logging.lastResort is before
    assert capsys.readouterr().err == "tool x\\x1b]0;owned\\x07\\x0aerror: forged listed\n"


def test_a_handler_someone_configured_gets_the_record_as_it_is(
    unconfigured: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    unconfigured.propagate = False
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(self.format(record))

    unconfigured.addHandler(Keep())
    with escaped_last_resort():
        unconfigured.warning("tool %s listed", "x\x1b]0")
    assert records == ["tool x\x1b]0 listed"]
    assert capsys.readouterr().err == ""
