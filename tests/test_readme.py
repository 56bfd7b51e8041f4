"""Every ```python block of the README runs, in order, in one namespace."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.DOTALL)


def test_readme_has_examples() -> None:
    assert len(python_blocks()) >= 4


def test_readme_examples_run() -> None:
    namespace: dict[str, object] = {"__name__": "readme"}
    for index, block in enumerate(python_blocks()):
        code = compile(block, f"README.md block {index}", "exec")
        exec(code, namespace)
