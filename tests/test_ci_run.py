"""``.ci/run``: it runs the README's test command as written, from a fresh venv, and stops at the first failure.

The script is run for real, in a copy of its directory layout, with ``python3.11``
and ``rg`` replaced by stubs on ``PATH``: the stub venv's ``pip`` fails, and every
later step would leave a mark in a log.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# python3.11 -m venv .venv: a venv whose every program records its name; pip fails.
FAKE_PYTHON = """#!/bin/sh
[ "$1 $2 $3" = "-m venv .venv" ] || { echo "python3.11 $*" >> "$STEPS"; exit 0; }
mkdir -p .venv/bin
for program in python dsh-tools mypy ruff nox; do
  printf '#!/bin/sh\\necho "%s $*" >> "$STEPS"\\n' "$program" > ".venv/bin/$program"
done
printf '#!/bin/sh\\necho "pip $*" >> "$STEPS"\\nexit 7\\n' > .venv/bin/pip
chmod +x .venv/bin/*
"""


def readme_test_command() -> str:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.DOTALL)
    (command,) = [block.strip() for block in blocks if "pytest" in block and "python3.11 -m venv" in block]
    return command


def test_ci_runs_the_readme_test_command_as_written() -> None:
    script = (REPO / ".ci" / "run").read_text()
    command = readme_test_command()
    assert command.startswith("python3.11 -m venv .venv && ") and "-m pytest" in command
    (line,) = [line for line in script.splitlines() if line.startswith(command)]
    assert line == f"{command} || exit"  # && lists escape set -e: a failure before the last step must stop CI


def test_ci_starts_from_a_fresh_venv_and_stops_at_a_failed_install(tmp_path: Path) -> None:
    (tmp_path / ".ci").mkdir()
    shutil.copy(REPO / ".ci" / "run", tmp_path / ".ci" / "run")
    stale = tmp_path / ".venv" / "installed-by-an-earlier-run"
    stale.parent.mkdir()
    stale.write_text("")
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "python3.11").write_text(FAKE_PYTHON)
    (stubs / "rg").write_text("#!/bin/sh\n")
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    steps = tmp_path / "steps.log"
    environment = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "STEPS": str(steps)}
    run = subprocess.run(
        ["bash", str(tmp_path / ".ci" / "run")], env=environment, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 7, run.stdout + run.stderr
    recorded = steps.read_text().splitlines()
    assert len(recorded) == 1 and recorded[0].startswith("pip install -q -e .[test,mcp]"), recorded
    assert not stale.exists()  # the old venv was removed, not reused


def test_ci_runs_the_benchmark_smoke_with_the_pinned_peers_installed() -> None:
    # Without the peers their recipes are skipped and never run: a broken one would pass CI.
    lines = (REPO / ".ci" / "run").read_text().splitlines()
    smoke = lines.index(".venv/bin/python -m benchmarks --smoke")
    installs = [index for index, line in enumerate(lines) if "-r benchmarks/requirements-peers.txt" in line]
    assert installs and installs[0] < smoke and lines[installs[0]].startswith(".venv/bin/pip install -q ")
    # The profiler the smoke run's profile part uses, pinned as nox's bench session pins it.
    (pin,) = re.findall(r"pyinstrument==[\d.]+", lines[installs[0]])
    assert f'"{pin}"' in (REPO / "noxfile.py").read_text()
