"""A raw MCP server over stdio (stdlib only) that answers ``tools/call`` the ways the SDK cannot.

``tests/test_mcp.py`` runs it as a subprocess: the SDK's own servers always
send well-formed messages, and the behaviours under test are about what
reaches the client's transport as text. Each tool is one kind of answer:

- ``ok``: a normal text result;
- ``calls``: the number of ``tools/call`` requests this process received;
- ``deep``: ``structuredContent`` nested deeper than the SDK's JSON parser accepts;
- ``wrong_id``: a result for a request id the client never sent;
- ``null_id``: an error with ``id: null`` (JSON-RPC's answer to an unreadable request);
- ``server_error``: a JSON-RPC error ``-32000`` (an implementation-defined server error);
- ``closed_error``: the same code with the message the SDK uses for a lost connection;
- ``bad_result``: a result that is no ``CallToolResult`` (``content`` is a string);
- ``stray_text``: a line of plain text on stdout, then a normal result;
- ``bad_utf8``: a result whose text holds bytes that are not UTF-8 (``a\\xff\\xfeb``);
- ``json_log``: a JSON log line on stdout (an object that is no JSON-RPC message), then a normal result;
- ``bad_note``: a notification whose ``params`` is not an object, then a normal result;
- ``shapeless``: an answer to the call whose ``result`` is not an object (no JSON-RPC message);
- ``close_stdout``: no answer: the process closes its stdout and goes on living (a minute, unless stopped);
- ``glued``: text without a newline (a progress note), then a normal result on the same line;
- ``orphan_crash``: starts a helper that inherits the stdout (and lives ``HELPER_S``), then dies;
- ``helper``, ``helper_crash``: start a helper (its pid appended to the file ``RAW_HELPER_PIDS`` names,
  output not inherited) that lives ``HELPER_S``; then answer, or die;
- ``big``: a normal result whose text is ``BIG`` bytes long;
- ``flood``: output without a newline, forever (a wedged server): no answer;
- ``stderr_noise``: terminal escapes (clear screen, a window title, a carriage return over a
  fake line), a line of ``LONG_LINE`` bytes and a last line without a newline on stderr, then a normal result.

Every tool is annotated read-only, so a client configured to retry would retry it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

TOOLS = [
    *("ok", "calls", "deep", "wrong_id", "null_id", "server_error", "closed_error", "bad_result", "stray_text"),
    *("bad_utf8", "json_log", "bad_note", "shapeless", "close_stdout", "stderr_noise", "big", "flood"),
    *("glued", "orphan_crash", "helper", "helper_crash"),
]
HELPER_S = 15
BIG = 2_000_000
DEPTH = 300
LONG_LINE = 1_000_000


def send(message: dict[str, Any]) -> None:
    write(json.dumps(message))


def write(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def answer_call(request_id: Any, name: str, calls: int) -> None:
    def result(value: dict[str, Any]) -> None:
        send({"jsonrpc": "2.0", "id": request_id, "result": value})

    if name == "calls":
        result({"content": [{"type": "text", "text": str(calls)}]})
    elif name == "deep":
        # Spliced in as text: json.dumps itself refuses to encode this depth.
        nested = "[" * DEPTH + '"x"' + "]" * DEPTH
        shallow = {"jsonrpc": "2.0", "id": request_id, "result": {"content": [], "structuredContent": {"v": "V"}}}
        write(json.dumps(shallow).replace('"V"', nested))
    elif name == "wrong_id":
        send({"jsonrpc": "2.0", "id": 12345, "result": {"content": []}})
    elif name == "null_id":
        send({"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Invalid Request"}})
    elif name == "server_error":
        send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32000, "message": "custom failure"}})
    elif name == "closed_error":  # the server's own answer, in the SDK's words for a lost connection
        send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32000, "message": "Connection closed"}})
    elif name == "bad_result":
        result({"content": "not a list"})
    elif name == "stray_text":
        write("debug: this line is not JSON-RPC")
        result({"content": [{"type": "text", "text": "fine"}]})
    elif name == "json_log":
        send({"level": "info", "msg": "handling tools/call"})
        result({"content": [{"type": "text", "text": "fine"}]})
    elif name == "bad_note":
        send({"jsonrpc": "2.0", "method": "notifications/message", "params": "oops"})
        result({"content": [{"type": "text", "text": "fine"}]})
    elif name == "shapeless":
        send({"jsonrpc": "2.0", "id": request_id, "result": "fine"})
    elif name == "close_stdout":
        sys.stdout.flush()
        os.close(1)
        time.sleep(60)
    elif name == "glued":
        sys.stdout.write("progress 50%")
        result({"content": [{"type": "text", "text": "fine"}]})
    elif name == "orphan_crash":
        import subprocess

        # stdout inherited (Python's default); stderr not, or the host's stderr relay would wait for it too.
        subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({HELPER_S})"], stderr=subprocess.DEVNULL)
        sys.stdout.flush()
        os._exit(1)
    elif name in ("helper", "helper_crash"):
        import subprocess

        quiet = subprocess.DEVNULL
        code = f"import time; time.sleep({HELPER_S})"
        helper = subprocess.Popen([sys.executable, "-c", code], stdin=quiet, stdout=quiet, stderr=quiet)
        with open(os.environ["RAW_HELPER_PIDS"], "a") as pids:
            pids.write(f"{helper.pid}\n")
        if name == "helper_crash":
            os._exit(1)
        result({"content": [{"type": "text", "text": "started"}]})
    elif name == "big":
        result({"content": [{"type": "text", "text": "b" * BIG}]})
    elif name == "flood":
        chunk = "y" * 65536
        while True:
            sys.stdout.write(chunk)
            sys.stdout.flush()
    elif name == "stderr_noise":
        sys.stderr.write("\x1b[2J\x1b]0;pwned\x07boom\rall clear\n")
        sys.stderr.write("x" * LONG_LINE + "\n")
        sys.stderr.write("last words")
        sys.stderr.flush()
        result({"content": [{"type": "text", "text": "fine"}]})
    elif name == "bad_utf8":
        head = json.dumps({"jsonrpc": "2.0", "id": request_id, "result": {"content": [{"type": "text", "text": "a"}]}})
        line = head.encode().replace(b'"a"', b'"a\xff\xfeb"') + b"\n"
        sys.stdout.flush()
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()
    else:
        result({"content": [{"type": "text", "text": "ok"}]})


def main() -> None:
    # RAW_EXTRA_NAMES (a JSON list): more names to list first, such as "" (any string is a name to JSON).
    names = [*json.loads(os.environ.get("RAW_EXTRA_NAMES", "[]")), *TOOLS]
    tools = [{"name": name, "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}} for name in names]
    # RAW_EXTRA_TOOLS (a JSON list): more tool definitions to list first, as they are (invalid ones too).
    tools = [*json.loads(os.environ.get("RAW_EXTRA_TOOLS", "[]")), *tools]
    calls = 0
    if os.environ.get("RAW_BOM"):  # a UTF-8 byte-order mark before the first message (.NET, PowerShell)
        sys.stdout.buffer.write(b"\xef\xbb\xbf")
    for line in sys.stdin:
        message = json.loads(line)
        method, request_id = message.get("method"), message.get("id")
        if method == "initialize":
            version = message["params"]["protocolVersion"]
            capabilities = {"tools": {"listChanged": False}}
            info = {"name": "raw", "version": "0"}
            send(
                {
                    "jsonrpc": "2.0",
                    "id": request_id,
                    "result": {"protocolVersion": version, "capabilities": capabilities, "serverInfo": info},
                }
            )
        elif method == "tools/list":
            send({"jsonrpc": "2.0", "id": request_id, "result": {"tools": tools}})
        elif method == "tools/call":
            calls += 1
            answer_call(request_id, message["params"]["name"], calls)
        elif request_id is not None:
            send({"jsonrpc": "2.0", "id": request_id, "result": {}})


if __name__ == "__main__":
    main()
