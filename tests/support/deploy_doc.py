"""The operator procedures of docs/deploy.md, run as written.

A fenced ```sh block that docs/deploy.md marks with ``<!-- test: NAME -->`` on the line
before it is read from the file when the test runs (never copied into the test), so a
procedure that stops working fails its test. ``run`` joins the named blocks into one bash
script (``set -euo pipefail``: variables set by one block are seen by the next) and runs it
with the variables the blocks expect, which the document's ``not-run`` blocks show with
example values.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "deploy.md"
MARK = re.compile(r"^<!-- test: ([\w-]+) -->\s*$")


def block(name: str) -> str:
    """The text of the ```sh block marked ``<!-- test: name -->``."""
    lines = DOC.read_text().splitlines()
    for i, line in enumerate(lines):
        found = MARK.match(line)
        if not found or found.group(1) != name:
            continue
        if lines[i + 1].strip() != "```sh":
            raise AssertionError(f"docs/deploy.md:{i + 2}: the block marked {name!r} is no ```sh")
        end = lines.index("```", i + 2)
        return "\n".join(lines[i + 2:end]) + "\n"
    raise AssertionError(f"docs/deploy.md has no block marked <!-- test: {name} -->")


def run(names: list[str], env: Mapping[str, str], cwd: Path, timeout: float = 120) -> str:
    """Run the blocks ``names`` in order in one bash; their output. Fails with the script and
    its output if it exits non-zero or outlasts ``timeout`` seconds."""
    script = "set -euo pipefail\n" + "".join(block(name) for name in names)
    # A session of its own: a server a block started in the background goes with it on a
    # timeout.
    process = subprocess.Popen(["bash", "-c", script], env={**os.environ, **env}, cwd=cwd,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        raise AssertionError(f"{names} did not end in {timeout} s:\n{script}\n{output}") from None
    assert process.returncode == 0, f"{names} exited {process.returncode}:\n{script}\n{output}"
    return output
