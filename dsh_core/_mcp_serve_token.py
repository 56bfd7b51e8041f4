"""Where ``dsh-tools serve-mcp --http`` gets its bearer token: a file, the environment, or a new one.

Every message here names the source, never the token: it may end up in a
terminal's scrollback or a CI log.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import attrs

from ._mcp_bearer import bearer_token_problem

TOKEN_ENV: Final = "DSH_MCP_TOKEN"
# A token is one short line; a file much longer than that is not a token file.
_MAX_LINE_BYTES: Final = 4096


class TokenSourceError(ValueError):
    """The options or the token source cannot give a usable token; the message says why and what to do."""


@attrs.frozen
class ServeToken:
    """The token to require (``None``: ``--no-auth``) and whether it was generated for this run."""

    value: str | None = attrs.field(repr=False)
    generated: bool = False


def serve_token(
    *, http: bool, token_file: Path | None, no_auth: bool, environ: Mapping[str, str] = os.environ
) -> ServeToken:
    """The token ``serve-mcp`` requires: ``--token-file``, else ``$DSH_MCP_TOKEN``, else a random one.

    Raises :class:`TokenSourceError` for options that contradict each other and
    for a source that gives no usable token (missing, empty, open to other
    users, holding spaces or control characters).
    """
    if not http:
        if token_file is not None or no_auth:
            given = "--token-file" if token_file is not None else "--no-auth"
            raise TokenSourceError(
                f"{given} applies to serve-mcp --http only (over stdio only the process that started "
                "the server can talk to it)"
            )
        return ServeToken(None)
    if no_auth:
        if token_file is not None:
            raise TokenSourceError("--no-auth turns authentication off: it cannot be combined with --token-file")
        if TOKEN_ENV in environ:
            raise TokenSourceError(
                f"--no-auth turns authentication off, but {TOKEN_ENV} is set: unset it or drop --no-auth"
            )
        return ServeToken(None)
    if token_file is not None:
        return ServeToken(_read_token_file(token_file))
    if TOKEN_ENV in environ:
        token = environ[TOKEN_ENV]
        if not token:
            raise TokenSourceError(f"{TOKEN_ENV} is set but empty: set it to the token, or unset it to have one made")
        problem = bearer_token_problem(token)
        if problem is not None:
            raise TokenSourceError(f"{TOKEN_ENV} cannot be used: {problem}")
        return ServeToken(token)
    return ServeToken(secrets.token_urlsafe(32), generated=True)


def _read_token_file(path: Path) -> str:
    """The first line of ``path``, stripped; refused when other users may read or change the file."""
    try:
        # Without blocking: a FIFO with no writer would hang serve-mcp here, before fstat refuses it.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as file:
            # fstat of the file read, not stat of the path: the path could be swapped in between.
            mode = os.fstat(file.fileno()).st_mode
            if not stat.S_ISREG(mode):
                raise TokenSourceError(f"the token file {path} is not a regular file")
            if os.name == "posix" and mode & 0o077:
                # As ssh does with a private key: a token others can read is no secret.
                raise TokenSourceError(
                    f"the token file {path} can be read or changed by other users "
                    f"(mode {stat.S_IMODE(mode):04o}): run chmod 600 {path}"
                )
            os.set_blocking(fd, True)
            line = file.readline(_MAX_LINE_BYTES + 1)
    except OSError as exc:
        raise TokenSourceError(f"cannot read the token file {path}: {exc.strerror or exc}") from None
    if len(line) > _MAX_LINE_BYTES:
        raise TokenSourceError(f"the first line of the token file {path} is too long for a token")
    try:
        token = line.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise TokenSourceError(f"the token file {path} is not UTF-8 text") from None
    if not token:
        raise TokenSourceError(f"the token file {path} is empty (the token is its first line)")
    problem = bearer_token_problem(token)
    if problem is not None:
        raise TokenSourceError(f"the token in {path} cannot be used: {problem}")
    return token
