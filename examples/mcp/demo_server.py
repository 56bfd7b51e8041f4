"""A tiny MCP server for trying the dsh-tools MCP client (stdio transport).

Run by the client plugin as configured in ``examples/mcp/dsh.toml``; by hand it
waits for JSON-RPC on stdin. Three tools:

- ``add``: structured output (``{"total": ...}``), marked read-only;
- ``shout``: plain text content (no output schema);
- ``delete_everything``: what a permissions rule should keep a model away from.
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations
from pydantic import BaseModel

server = MCPServer("dsh-demo")


class Sum(BaseModel):
    total: int


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def add(a: int, b: int) -> Sum:
    """Add two integers."""
    return Sum(total=a + b)


@server.tool(structured_output=False)
def shout(text: str) -> str:
    """Upper-case the text and add an exclamation mark."""
    return text.upper() + "!"


@server.tool(structured_output=False)
def delete_everything() -> str:
    """Pretend to delete everything (it does nothing)."""
    return "everything deleted (not really)"


if __name__ == "__main__":
    server.run()
