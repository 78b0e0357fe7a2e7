"""The examples of README.md and docs/client.md, run in order as a new user would paste them.

The blocks are read from the Markdown when the test runs (never copied here), so an example
that stops working fails CI. The convention, also in the README's "Development" section:

- A fenced block tagged ```sh runs in bash (``set -euo pipefail``), one ```python in the
  project's Python, in document order: README.md first, then docs/client.md. Exported
  variables carry over from one sh block to the next, and into the python blocks. Blocks tagged
  ```text or ```json show output and are not run; any other tag (```bash, ```console) fails the
  test, so that a runnable-looking block cannot be skipped silently.
- An HTML comment on the line just before a block changes what happens to it:
  ``<!-- not-run: why -->`` skips it (the reason is required);
  ``<!-- background NAME: 127.0.0.1:PORT -->`` marks a command that keeps running
  (``timewheel serve``, ``timewheel listen``): the test starts it, waits until it listens on
  that address (no connection: a listener would print it), and stops it at the end.
- A comment on a line of its own, ``<!-- wait-for: NAME prints "TEXT" -->``, waits (up to 30 s)
  until the background command NAME has printed TEXT: how the test sees that a callback arrived.

What the test gives the blocks:

- Addresses: the examples use 127.0.0.1:8080 for the service, 127.0.0.1:8081 for a second one
  (the README's scoped tokens) and 127.0.0.1:9000 for ``timewheel listen``. The test replaces
  ``127.0.0.1:PORT`` / ``--port PORT`` of these three in every block by free ports of its own,
  so that it can run beside other tests; nothing but loopback is ever called. A port another
  test worker takes before the background command binds it is replaced by a new one, and the
  command started again: no block has used it yet (each background command starts before any
  block calls its address).
- The environment: ``TIMEWHEEL_URL`` and ``TIMEWHEEL_PORT`` (that free port),
  ``TIMEWHEEL_DATA_DIR`` in the test's tmp dir (the embedded Redis), this Python's ``bin`` and
  scripts dirs first on PATH (``python3``, ``timewheel``), and a curl configuration with
  ``--fail-with-body``: a ``curl -s`` answered with a 4xx or 5xx fails its block, as it
  should fail a user.
- Each block has 60 s. A failure names the file, the block's line and its text, its output,
  and the last output of the background commands.

A block that only defines something is only run; the README's signature snippet is also called,
by the second test, on a signed callback without a body.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

from tests.support.ports import listens_on, on_a_free_port
from tests.support.redis_server import free_port
from tests.support.waiting import settle

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = ("README.md", "docs/client.md")
RUN = {"sh", "python"}
SHOWN = {"text", "json"}
BLOCK_SECONDS = 60
WAIT_SECONDS = 30
# as the examples write them; 8081 is the README's second service (scoped tokens), 8082 its
# third (encryption at rest)
SERVICE_PORT, SECOND_PORT, LISTEN_PORT, THIRD_PORT = "8080", "8081", "9000", "8082"

FENCE = re.compile(r"^```(\S*)\s*$")
MARKER = re.compile(r"^<!--\s*(.*?)\s*-->\s*$")
BACKGROUND = re.compile(r"^background ([\w-]+): (127\.0\.0\.1:\d+)$")
WAIT_FOR = re.compile(r'^wait-for: ([\w-]+) prints "(.+)"$')
ADDRESS = re.compile(r"(127\.0\.0\.1:|--port )(8080|8081|8082|9000)\b")


@dataclass(frozen=True)
class Step:
    """One thing to do, in document order: a block to run, or a wait."""

    document: str
    line: int  # 1-based line of the fence (or of the wait-for comment)
    kind: str  # "sh", "python", "background" or "wait-for"
    text: str = ""
    name: str = ""  # background or wait-for: the command's name
    target: str = ""  # background: its address, host:port; wait-for: the text

    def where(self) -> str:
        return f"{self.document}, block at line {self.line}"


def steps_of(document: str) -> tuple[list[Step], list[str]]:
    """The document's steps, and the reasons of its not-run blocks."""
    lines = (ROOT / document).read_text().splitlines()
    steps: list[Step] = []
    skipped: list[str] = []
    marker: str | None = None  # the comment on the line just before, if any
    i = 0
    while i < len(lines):
        line = lines[i]
        comment = MARKER.match(line)
        fence = FENCE.match(line)
        if comment:
            marker = comment.group(1)
            wait = WAIT_FOR.match(marker)
            if wait:
                steps.append(Step(document, i + 1, "wait-for", name=wait.group(1),
                                  target=wait.group(2)))
                marker = None
        elif fence:
            tag, start = fence.group(1), i
            i += 1
            while i < len(lines) and lines[i].rstrip() != "```":
                i += 1
            if i == len(lines):
                pytest.fail(f"{document}:{start + 1}: a fence that is never closed")
            text = "\n".join(lines[start + 1:i]) + "\n"
            step = _block(document, start + 1, tag, text, marker, skipped)
            if step is not None:
                steps.append(step)
            marker = None
        elif line.strip():
            marker = None
        i += 1
    return steps, skipped


def _block(document: str, line: int, tag: str, text: str, marker: str | None,
           skipped: list[str]) -> Step | None:
    where = f"{document}:{line}"
    if tag in SHOWN:
        return None
    if tag not in RUN:
        pytest.fail(f"{where}: a ```{tag or '(untagged)'} block: tag it ```sh or ```python "
                    f"(run) or ```text / ```json (output), see {Path(__file__).name}")
    if marker is None:
        return Step(document, line, tag, text)
    if marker.startswith("not-run"):
        reason = marker.removeprefix("not-run").lstrip(":").strip()
        if not reason:
            pytest.fail(f"{where}: <!-- not-run: ... --> needs a reason")
        skipped.append(f"{where}: {reason}")
        return None
    background = BACKGROUND.match(marker)
    if background and tag == "sh":
        return Step(document, line, "background", text, name=background.group(1),
                    target=background.group(2))
    pytest.fail(f"{where}: unknown marker <!-- {marker} --> before a ```{tag} block")


class Session:
    """The shell a user pastes into: its environment, its tmp dir, its background commands."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ports: dict[str, str] = {}
        curl_home = directory / "curl"
        curl_home.mkdir()
        (curl_home / ".curlrc").write_text("fail-with-body\nshow-error\n")
        # This interpreter's dir (python3) and where pip put its scripts (timewheel): the
        # same dir in a venv, not always for a system Python.
        bin_dirs = dict.fromkeys([str(Path(sys.executable).parent), sysconfig.get_path("scripts")])
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TIMEWHEEL_")}
        self.env.update({
            "PATH": os.pathsep.join([*bin_dirs, os.environ.get("PATH", "")]),
            "CURL_HOME": str(curl_home),
            "TIMEWHEEL_DATA_DIR": str(directory / "data"),
            "PYTHONUNBUFFERED": "1",
        })
        self.background: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
        for documented in (SERVICE_PORT, SECOND_PORT, LISTEN_PORT, THIRD_PORT):
            self.use_port(documented, free_port())

    def use_port(self, documented: str, port: int) -> None:
        """Blocks run from now on get ``port`` for the examples' ``documented`` port."""
        self.ports[documented] = str(port)
        if documented == SERVICE_PORT:
            self.env.update(TIMEWHEEL_URL=f"http://127.0.0.1:{port}", TIMEWHEEL_PORT=str(port))

    def localise(self, text: str) -> str:
        return ADDRESS.sub(lambda m: m.group(1) + self.ports[m.group(2)], text)

    def run(self, step: Step) -> None:
        if step.kind == "background":
            self.start(step)
        elif step.kind == "wait-for":
            self.wait_for(step)
        elif step.kind == "sh":
            self.shell(step)
        else:
            self.python(step)

    def shell(self, step: Step) -> None:
        env_out = self.directory / "env.out"
        script = (f"set -euo pipefail\n{self.localise(step.text)}\n"
                  f"env -0 > {env_out}\n")
        self._check(step, ("bash", "-c", script))
        self.env = dict(item.split("=", 1) for item in
                        env_out.read_text().split("\0") if "=" in item)

    def python(self, step: Step) -> None:
        self._check(step, (sys.executable, "-c", self.localise(step.text)))

    def _check(self, step: Step, argv: tuple[str, ...]) -> None:
        try:
            done = subprocess.run(argv, cwd=self.directory, env=self.env, capture_output=True,
                                  timeout=BLOCK_SECONDS, stdin=subprocess.DEVNULL, check=False)
        except subprocess.TimeoutExpired as exc:
            self.fail(step, f"did not finish in {BLOCK_SECONDS} s", exc.stdout, exc.stderr)
        if done.returncode != 0:
            self.fail(step, f"exited with status {done.returncode}", done.stdout, done.stderr)

    def start(self, step: Step) -> None:
        """Start a background command and wait until its own process listens on its address
        (another worker's server that took the port would accept a connection there too);
        on a new port if that one was taken before the command bound it."""
        documented = step.target.rsplit(":", 1)[1]
        try:
            on_a_free_port(lambda port: self._start(step, documented, port),
                           lambda: self.background[step.name][1].read_text(errors="replace"),
                           int(self.ports[documented]))
        except RuntimeError as exited:
            self.fail(step, str(exited))

    def _start(self, step: Step, documented: str, port: int) -> None:
        self.use_port(documented, port)
        log = self.directory / f"{step.name}.log"
        with open(log, "wb") as out:
            process = subprocess.Popen(
                ("bash", "-c", self.localise(step.text)), cwd=self.directory,
                env=self.env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        self.background[step.name] = (process, log)

        def listening() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"exited with status {process.returncode} instead of running")
            return listens_on(process.pid, port)

        self.settle_step(step, listening, f"it to listen on {self.localise(step.target)}")

    def wait_for(self, step: Step) -> None:
        if step.name not in self.background:
            self.fail(step, f"no background command named {step.name!r} was started before")
        process, log = self.background[step.name]

        def printed() -> bool:
            exited = process.poll() is not None  # read before the log: it printed all it will
            if step.target in log.read_text(errors="replace"):
                return True
            if exited:
                self.fail(step, f"{step.name} exited with status {process.returncode} "
                          f"without printing {step.target!r}")
            return False

        self.settle_step(step, printed, f"{step.name} to print {step.target!r}")

    def settle_step(self, step: Step, probe: Callable[[], bool], what: str) -> None:
        """``settle`` for WAIT_SECONDS, failing the way every step fails: with the step's
        place in the docs and every background command's output."""
        try:
            settle(probe, WAIT_SECONDS, what)
        except AssertionError as timed_out:
            self.fail(step, str(timed_out))

    def fail(self, step: Step, what: str, stdout: bytes | None = None,
             stderr: bytes | None = None) -> NoReturn:
        parts = [f"{step.where()} {what}:", _indent(self.localise(step.text) or step.target)]
        for label, data in (("stdout", stdout), ("stderr", stderr)):
            if data:
                parts += [f"{label}:", _indent(data.decode(errors="replace")[-4000:])]
        for name, (_, log) in self.background.items():
            parts += [f"{name} (background), last output:",
                      _indent(log.read_text(errors="replace")[-3000:])]
        pytest.fail("\n".join(parts), pytrace=False)

    def stop(self) -> None:
        for process, _ in self.background.values():
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.rstrip().splitlines())


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    s = Session(tmp_path)
    try:
        yield s
    finally:
        s.stop()


# 35 steps one after another, each bounded (BLOCK_SECONDS, WAIT_SECONDS): ~40 s
# alone, past the suite's 120 s when the machine is loaded (seen with two CPU burners).
@pytest.mark.timeout(300)
def test_readme_and_client_examples_work_when_pasted_in_order(session: Session) -> None:
    ran: dict[str, int] = {}
    for document in DOCUMENTS:
        steps, skipped = steps_of(document)
        ran[document] = sum(step.kind in RUN for step in steps)
        assert ran[document] > 0, f"{document}: no ```sh or ```python block found to run"
        for step in steps:
            session.run(step)
        for reason in skipped:
            print(f"not run: {reason}")  # noqa: T201 (shown with -rP: what the test leaves out)
    assert {"serve", "listen"} <= session.background.keys(), (
        "README.md must start `timewheel serve` and `timewheel listen` as background blocks "
        "(its first callback goes to the listener)")


def test_the_readme_signature_snippet_verifies_a_callback_without_a_body() -> None:
    """The README's standardwebhooks snippet, taken from the README, accepts a callback with
    no body (a GET, a schedule without one) signed as the dispatcher signs it, and refuses a
    forged one; the control shows that the library's default (json_parse) fails on it."""
    from standardwebhooks.webhooks import Webhook, WebhookVerificationError

    from timewheel.delivery.signing import Signer

    snippets = [step.text for step in steps_of("README.md")[0]
                if step.kind == "python" and "standardwebhooks" in step.text]
    assert len(snippets) == 1, "README.md: one ```python block with the standardwebhooks snippet"
    namespace: dict[str, object] = {}
    exec(snippets[0], namespace)  # the README's own code, as a reader would run it
    verified = namespace["verified"]
    assert callable(verified)

    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    now = int(time.time())
    headers = {"webhook-id": "nightly.1800000000000", "webhook-timestamp": str(now),
               "webhook-signature": Signer([secret]).sign("nightly.1800000000000", now, b"")}
    assert verified(secret, b"", headers) == b""
    with pytest.raises(WebhookVerificationError):
        verified(secret, b"", {**headers, "webhook-id": "forged"})
    with pytest.raises(ValueError):  # json.JSONDecodeError: what the issue saw
        Webhook(secret).verify(b"", headers)
