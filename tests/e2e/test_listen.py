"""``timewheel listen`` as a user runs it: a real process that prints what a real
``timewheel serve`` sends it, and judges each request's signature."""

from __future__ import annotations

import base64
import io
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from aiohttp.test_utils import TestClient, TestServer
from standardwebhooks import Webhook

from tests.e2e.conftest import Service
from tests.support.ports import listens_on, on_a_free_port
from tests.support.waiting import settle
from timewheel.listen import listen_url, make_app, secret_from_environment

pytestmark = pytest.mark.e2e

SECRET = "whsec_" + base64.b64encode(b"listen-test-secret-32-bytes-long").decode()


class Listener:
    """One ``timewheel listen`` process; its stdout goes to a file the test reads."""

    def __init__(self, directory: Path, *argv: str) -> None:
        on_a_free_port(lambda port: self._start(directory, port, argv), self.text)

    def _start(self, directory: Path, port: int, argv: tuple[str, ...]) -> None:
        self.port = port
        self.out = directory / f"listen-{self.port}.out"
        env = {k: v for k, v in os.environ.items() if not k.startswith("TIMEWHEEL_")}
        with open(self.out, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "timewheel", "listen", "--port", str(self.port), *argv],
                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{self.port}"
        self.wait_for("timewheel listen: on")
        # The banner comes once the socket is bound, but another worker's server may hold the
        # same port number on another address: ask this process's own socket.
        settle(self._ready, 20, lambda: f"listen to answer /ready; its output:\n{self.text()}")

    def _ready(self) -> bool:
        """It listens on its port (another worker's server there would answer as well, and is
        not asked) and answers."""
        self._running()
        if not listens_on(self.process.pid, self.port):
            return False
        try:
            httpx.get(f"{self.url}/ready", timeout=1)
        except httpx.TransportError:
            return False
        return True

    def _running(self) -> None:
        """Ends a wait at once if the process has exited: it will not print anything more."""
        if self.process.poll() is not None:
            raise RuntimeError(f"listen exited {self.process.returncode}:\n{self.text()}")

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def wait_for(self, needle: str, count: int = 1, timeout: float = 30) -> str:
        def printed() -> str | None:
            text = self.text()
            if text.count(needle) >= count:
                return text
            self._running()
            return None

        return settle(printed, timeout, lambda: f"{needle!r} x{count} printed; printed so far:"
                      f"\n{self.text()}")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.terminate()
        return self.process.wait(20)


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[Callable[..., Listener]]:
    started: list[Listener] = []

    def start(*argv: str) -> Listener:
        started.append(Listener(tmp_path, *argv))
        return started[-1]

    yield start
    for one in started:
        one.process.kill()
        one.process.wait()


def _requests(text: str) -> list[str]:
    """The printed requests, each from its ``---`` line on (the /ready probe included)."""
    return ["---" + part for part in text.split("\n---")[1:]]


def test_a_signed_callback_from_serve_is_printed_and_verified(
        start_service: Callable[..., Service], listener: Callable[..., Listener]) -> None:
    listen = listener("--secret", SECRET)
    service = start_service(signing_secret=SECRET)
    with service.client() as client:
        answer = client.post("/tasks", json={
            "key": "first-callback", "callback_url": f"{listen.url}/hook?from=serve",
            "headers": {"X-Greeting": "hello"}, "body": {"order": 42}})
        assert answer.status_code == 201, answer.text
    text = listen.wait_for("webhook-id: first-callback")
    printed = next(r for r in _requests(text) if "first-callback" in r)
    assert printed.splitlines()[0].endswith("POST /hook?from=serve")
    assert "X-Greeting: hello" in printed
    assert '"order": 42' in printed
    assert printed.rstrip().endswith("signature ok"), printed
    # The probe the fixture sent had no signature at all, and says so.
    probe = _requests(text)[0]
    assert probe.splitlines()[0].endswith("GET /ready")
    assert "signature INVALID (no webhook-id, webhook-timestamp, webhook-signature header)" \
        in probe
    with service.client() as client:  # it answered 200 (the default): delivered
        settle(lambda: client.get("/tasks/first-callback").json()["status"] == "succeeded", 20,
               lambda: f"first-callback succeeded; the service's log:\n{service.log()}")
    assert listen.stop() == 0


def test_a_tampered_request_is_invalid_and_answered_with_the_given_status(
        listener: Callable[..., Listener]) -> None:
    listen = listener("--secret", SECRET, "--status", "503")
    body = b'{"amount": 10}'
    timestamp = int(time.time())
    # Signed by the Standard Webhooks reference library, so the verifier is checked against it.
    signature = Webhook(SECRET).sign("tampered", _dt(timestamp), body.decode())
    headers = {"webhook-id": "tampered", "webhook-timestamp": str(timestamp),
               "webhook-signature": signature, "content-type": "application/json"}
    genuine = httpx.post(f"{listen.url}/genuine", content=body, headers=headers)
    forged = httpx.post(f"{listen.url}/forged", content=b'{"amount": 1000}', headers=headers)
    assert (genuine.status_code, forged.status_code) == (503, 503)
    text = listen.wait_for("POST /forged")
    verdicts = {r.splitlines()[0].split()[-1]: r.rstrip().splitlines()[-1]
                for r in _requests(text)}
    assert verdicts["/genuine"] == "signature ok"
    assert verdicts["/forged"].startswith("signature INVALID (does not match"), text


def test_listen_refuses_a_bad_secret_and_a_taken_port(listener: Callable[..., Listener]
                                                      ) -> None:
    bad = subprocess.run([sys.executable, "-m", "timewheel", "listen", "--secret", "nope"],
                         capture_output=True, text=True, timeout=30, check=False)
    assert bad.returncode == 2 and "whsec_" in bad.stderr
    taken = listener()
    again = subprocess.run([sys.executable, "-m", "timewheel", "listen", "--port",
                            str(taken.port)], capture_output=True, text=True, timeout=30,
                           check=False)
    assert again.returncode == 1 and f"cannot listen on 127.0.0.1:{taken.port}" in again.stderr
    # It never said it was listening: the banner comes once the port is bound.
    assert "timewheel listen: on" not in again.stdout, again.stdout


def _dt(timestamp: int):  # type: ignore[no-untyped-def]
    from datetime import UTC, datetime

    return datetime.fromtimestamp(timestamp, tz=UTC)


@pytest.mark.parametrize("value", ["nope", "whsec_", f" , nope,{SECRET}"])
def test_listen_refuses_a_malformed_secret_from_the_environment(value: str) -> None:
    """Without --secret, listen checks with TIMEWHEEL_SIGNING_SECRET's first secret; a
    malformed one printed argparse's ArgumentTypeError as a traceback. One line, exit 2, as
    for a bad --secret, and never the value."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIMEWHEEL_")}
    env["TIMEWHEEL_SIGNING_SECRET"] = value
    done = subprocess.run([sys.executable, "-m", "timewheel", "listen", "--port", "9"],
                          env=env, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 2, done
    assert done.stdout == ""
    assert done.stderr.startswith("timewheel listen: TIMEWHEEL_SIGNING_SECRET: "), done.stderr
    assert done.stderr.count("\n") == 1 and "nope" not in done.stderr


@pytest.mark.parametrize(("value", "expected"), [
    ("", None), (" ", None), (",", None), (SECRET, SECRET), (f" , {SECRET} ,x", SECRET),
    (f"{SECRET},whsec_b3RoZXItc2VjcmV0LTE2Ynl0ZXM=", SECRET)])
def test_listen_reads_the_environment_as_the_service_does(value: str,
                                                          expected: str | None) -> None:
    """Comma-separated, blank entries dropped (timewheel/settings.py): a blank variable is no
    secret, and a leading comma does not make the first secret an empty one."""
    assert secret_from_environment({"TIMEWHEEL_SIGNING_SECRET": value}) == expected
    assert secret_from_environment({}) is None


async def test_a_callback_is_answered_whatever_stdout_can_encode() -> None:
    """On a stdout that cannot encode the request (PYTHONIOENCODING=ascii, a Latin-1 locale,
    a redirected Windows console), printing it raised UnicodeEncodeError: the callback was
    answered 500 (so retried) and a traceback printed. It is printed with escapes instead."""
    out = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    app = make_app(secret=None, status=200, out=out)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        response = await client.post("/caf\u00e9", json={"note": "caf\u00e9 \u2603"})
    assert response.status == 200
    text = out.buffer.getvalue().decode("ascii")
    assert "POST /caf" in text
    assert '"note": "caf\\xe9 \\u2603"' in text


@pytest.mark.parametrize(("host", "port", "url"), [
    ("127.0.0.1", 9000, "http://127.0.0.1:9000/"), ("localhost", 80, "http://localhost:80/"),
    ("::1", 9000, "http://[::1]:9000/"), ("fe80::1%eth0", 1, "http://[fe80::1%25eth0]:1/")])
def test_the_banner_names_a_url_that_can_be_pasted(host: str, port: int, url: str) -> None:
    """``--host ::1`` printed ``on http://::1:9000/``, which no client takes as a URL."""
    assert listen_url(host, port) == url
