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


def test_quick_start_says_how_to_run_it_without_python311() -> None:
    # The commands name python3.11 literally (CI runs them verbatim); a machine with only
    # Python 3.13 must be told to substitute its interpreter.
    quick_start = README.read_text(encoding="utf-8").split("## Quick start", 1)[1].split("```bash", 1)[0]
    assert "Python 3.11 or newer" in quick_start
    assert "if yours has another name (`python3.13`, `python3`),\nput that in its place" in quick_start
