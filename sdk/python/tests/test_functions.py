"""End to end: Python functions (tests/pyfn.py) in chains run by the real ``zerohop up``
(target/release/zerohop, or $ZEROHOP_BIN), answered over real HTTP.

The functions run as the chain's own uid, so the interpreter and the installed ``zerohop``
package must be readable by others: the interpreter is $ZEROHOP_PYTHON, else this one if
others may run it, else /usr/bin/python3; the package is found where this process imports
it from (``cargo xtask test`` installs it into target/python-sdk)."""

from __future__ import annotations

import http.client
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import zerohop

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
PYFN = HERE / "pyfn.py"
PACKAGE_DIR = Path(zerohop.__file__).resolve().parent.parent


def _python() -> str:
    if os.environ.get("ZEROHOP_PYTHON"):
        return os.environ["ZEROHOP_PYTHON"]
    exe = Path(sys.executable).resolve()
    parents_open = all(p.stat().st_mode & stat.S_IXOTH for p in exe.parents)
    if parents_open and exe.stat().st_mode & stat.S_IXOTH:
        return str(exe)
    return "/usr/bin/python3"


def _zerohop() -> str:
    b = os.environ.get("ZEROHOP_BIN") or str(ROOT / "target/release/zerohop")
    if not Path(b).exists():
        pytest.fail(f"{b} is missing: `cargo build --release` (cargo xtask test does)")
    return b


def fn(name: str, mode: str, env: str = "", fields: str = "") -> str:
    return (
        f'  {name}: {{ command: ["{_python()}", "{PYFN}"], env: {{ PYFN_MODE: {mode}, '
        f'PYTHONPATH: "{PACKAGE_DIR}"{env} }}{fields} }}\n'
    )


class Chain:
    """A running ``zerohop up`` on a free port; stopped by :meth:`stop`."""

    def __init__(self, tmp: Path, spec: str) -> None:
        file = tmp / "chain.yaml"
        file.write_text(spec)
        self.proc = subprocess.Popen(
            [_zerohop(), "up", str(file), "--listen", "127.0.0.1:0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
        )
        found: list[str] = []
        # What it writes to standard error (its own lines and, echoed as
        # "[function/instance] text", every instance's), each passed on to ours too.
        self.lines: list[str] = []
        self.lines_changed = threading.Condition()

        def read_stderr() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                sys.stderr.write(line)
                with self.lines_changed:
                    self.lines.append(line)
                    self.lines_changed.notify_all()

        threading.Thread(target=read_stderr, daemon=True).start()

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                m = re.search(r"ready at (http://[0-9.:]+)", line)
                if m:
                    found.append(m.group(1))

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + 30
        while not found and time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(0.05)
        if not found:
            self.stop()
            pytest.fail("zerohop up was not ready within 30 s")
        self.url = found[0]

    def wait_for(self, marker: str, guard: float, what: str) -> str:
        """Waits at most ``guard`` seconds for a line of the chain's standard error that
        contains ``marker``; fails the test saying that ``what`` never happened otherwise."""
        with self.lines_changed:
            found = self.lines_changed.wait_for(
                lambda: next((line for line in self.lines if marker in line), None), guard
            )
        if found is None:
            pytest.fail(
                f"{what} never happened: the chain wrote no line with {marker!r} "
                f"within {guard} s"
            )
        return found

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def instances(self) -> list[int]:
        """The chain's instance processes: the children of ``zerohop up`` but its spawner."""
        out = []
        for p in Path("/proc").iterdir():
            if not p.name.isdigit():
                continue
            try:
                s = (p / "stat").read_text()
            except OSError:
                continue
            comm = s[s.index("(") + 1 : s.rindex(")")]
            ppid = int(s[s.rindex(")") + 2 :].split()[1])
            if ppid == self.proc.pid and comm != "zerohop-spawner":
                out.append(int(p.name))
        return out


@pytest.fixture
def chain_of(tmp_path: Path):
    chains: list[Chain] = []

    def start(spec: str) -> Chain:
        c = Chain(tmp_path, spec)
        chains.append(c)
        return c

    yield start
    for c in chains:
        c.stop()


def post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, data=body, headers=headers or {}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_python_functions(chain_of) -> None:
    spec = (
        "name: pysdk\nstate: { entries: 16, value_size: 64 }\nfunctions:\n"
        + fn("up", "upper")
        + fn("bang", "exclaim")
        + fn("oops", "raise")
        + fn("no", "fail")
        + fn("caller", "call", ', PYFN_CALLS: "up,no"', ", calls: [up, no]")
        + fn("fan", "callall", ', PYFN_CALLS: "up,no,bang"', ", calls: [up, no, bang]")
        + fn("join", "join", ', PYFN_CALLS: "up,bang"')
        + fn("count", "count", "", ", state: true")
        + fn("hdr", "header", "", ", headers: [X-Test]")
        + fn("fwd", "forward", ", PYFN_TARGET: up", ", next: [up]")
        + "routes:\n"
        + "  - http: POST /hello\n    sequence: [up, bang]\n"
        + "  - http: POST /oops\n    sequence: [oops]\n"
        + "  - http: POST /no\n    sequence: [no]\n"
        + "  - http: POST /call\n    sequence: [caller]\n"
        + "  - http: POST /fan\n    sequence: [fan]\n"
        + "  - http: POST /join\n    sequence: [{ fan_out: [up, bang], join: join }]\n"
        + "  - http: POST /count\n    sequence: [count]\n"
        + "  - http: POST /hdr\n    sequence: [hdr]\n"
        + "  - http: POST /fwd\n    sequence: [fwd]\n"
    )
    c = chain_of(spec)
    assert post(c.url + "/hello", b"hello from python") == (200, "HELLO FROM PYTHON!")
    # An exception: 500 naming its type; the instance serves on.
    for _ in range(2):
        assert post(c.url + "/oops", b"x") == (500, "function 'oops': ValueError: bad input\n")
    assert post(c.url + "/no", b"this") == (422, "function 'no': refusing this\n")
    assert post(c.url + "/call", b"ab") == (200, "up=AB;no!422;")
    assert post(c.url + "/fan", b"cd") == (200, "up=CD;no!422;bang=cd!;")
    assert post(c.url + "/join", b"ef") == (200, "up=EF;bang=ef!;")
    for n in range(1, 4):
        assert post(c.url + "/count", b"visits") == (200, str(n))
    assert post(c.url + "/hdr", b"", {"X-Test": "from the client"}) == (200, "from the client")
    assert post(c.url + "/hdr", b"") == (200, "<none>")
    assert post(c.url + "/fwd", b"forwarded") == (200, "FORWARDED")


def test_a_10_mib_body_is_one_view_through_large_slots(chain_of) -> None:
    """Bodies far beyond a slot (64 KiB by default) travel in large slots: the gateway streams
    a 10 MiB request into one and each function sees it whole as one view (upper-cases it in
    place, appends to it); a call's 1 MiB input goes into one, and a callee's output that
    outgrows its small slot (2 bytes in, 10 MiB out) moves into one and is read in place by
    its caller."""
    ten = 10 << 20
    spec = (
        "name: pysdk5\nfunctions:\n"
        + fn("up", "upper")
        + fn("bang", "exclaim")
        + fn("grow", "grow", f", PYFN_GROW_TO: {ten}")
        + fn("sizes", "sizes", ', PYFN_CALLS: "up,grow:2"', ", calls: [up, grow]")
        + "routes:\n"
        + "  - http: POST /big\n    sequence: [up, bang]\n"
        + "  - http: POST /sizes\n    sequence: [sizes]\n"
    )
    c = chain_of(spec)
    body = bytes(b"abcdefghij"[i % 10] for i in range(ten))
    req = urllib.request.Request(c.url + "/big", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 200
        answer = r.read()
    assert len(answer) == ten + 1
    assert answer == body.upper() + b"!"
    mib = b"xy" * (1 << 19)
    assert post(c.url + "/sizes", mib) == (
        200,
        f"up={1 << 20}:XYXY..XY;grow={ten}:xyxy..xy;",
    )
    # A small request after them still takes a small slot and answers.
    assert post(c.url + "/big", b"small") == (200, "SMALL!")


def get(url: str, path: str, headers: dict[str, str] | None = None):
    """GET ``path`` with http.client (redirects are not followed): (status, message, body)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("GET", path, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.msg, r.read().decode()
    finally:
        conn.close()


def test_route_parameters_query_cookies_and_answer_headers(chain_of) -> None:
    spec = (
        "name: pysdk4\nfunctions:\n"
        + fn("item", "item", "", ', headers: [":path", ":query", cookie]')
        + "routes:\n  - http: GET /item/{id}\n    sequence: [item]\n"
    )
    c = chain_of(spec)
    status, msg, body = get(
        c.url, "/item/42?q=caf%C3%A9+au+lait&n=1", {"Cookie": "other=x; session=s-1"}
    )
    assert (status, body) == (
        303,
        "path=/item/42 route=/item/{id} id=42 query=q=caf%C3%A9+au+lait&n=1 "
        "q=café au lait session=s-1 refused=500:`Content-Length` is set by the gateway, "
        "not by functions status404=500 with-view=BufferError",
    )
    assert msg.get_all("Location") == ["/item/42/done"]
    assert msg.get_all("Set-Cookie") == ["seen=42; Path=/"]
    # Without a query or cookies: absent (None), not empty; the parameter all the same.
    status, _, body = get(c.url, "/item/7")
    assert status == 303, body
    assert body.startswith("path=/item/7 route=/item/{id} id=7 query=- q=- session=- "), body


def test_runtime_python_runs_a_handler_by_module_and_function() -> None:
    # The chain's uid reads the module, so its folder must be open to others (pytest's
    # tmp_path is not).
    folder = Path(tempfile.mkdtemp(prefix="zerohop-pyrt-"))
    folder.chmod(0o755)
    c = None
    try:
        (folder / "greeting.py").write_text(
            "import zerohop\n\n"
            "def greet(req: zerohop.Request) -> bytes:\n"
            "    with req.body as body:\n"
            "        return b'hello, ' + bytes(body)\n"
        )
        (folder / "greeting.py").chmod(0o644)
        spec = (
            "name: pyrt\nfunctions:\n"
            f'  greet: {{ runtime: python, handler: "greeting:greet", '
            f'interpreter: "{_python()}", env: {{ PYTHONPATH: "{PACKAGE_DIR}" }} }}\n'
            "routes:\n  - http: POST /greet\n    sequence: [greet]\n"
        )
        c = Chain(folder, spec)
        assert post(c.url + "/greet", b"world") == (200, "hello, world")
        c.stop()
        # `python3 -m zerohop` names what is missing, and exits 2.
        def loader(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [_python(), "-m", "zerohop", *args],
                env={**os.environ, "PYTHONPATH": str(PACKAGE_DIR)},
                capture_output=True,
                text=True,
                timeout=30,
            )

        out = loader("--path", str(folder), "greeting:absent")
        assert out.returncode == 2
        assert "greeting has no function 'absent'" in out.stderr
        out = loader("nomodule_here:f")
        assert out.returncode == 2
        assert "cannot import 'nomodule_here'" in out.stderr
    finally:
        if c is not None:
            c.stop()
        shutil.rmtree(folder, ignore_errors=True)


def test_a_view_kept_past_the_handler_stops_the_instance(chain_of) -> None:
    spec = (
        "name: pysdk2\nfunctions:\n"
        + fn("keep", "keep")
        + "routes:\n  - http: POST /keep\n    sequence: [keep]\n"
    )
    c = chain_of(spec)
    first = c.instances()
    assert len(first) == 1
    status, body = post(c.url + "/keep", b"kept")
    assert status == 502, body
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (c.instances() == first or not c.instances()):
        time.sleep(0.05)
    assert c.instances() and c.instances() != first, "a new instance replaces it"


def _ticks(pid: int) -> int:
    s = Path(f"/proc/{pid}/stat").read_text()
    f = s[s.rindex(")") + 2 :].split()
    return int(f[11]) + int(f[12])


def test_an_idle_instance_uses_no_cpu_and_a_killed_one_is_restarted(chain_of) -> None:
    spec = (
        "name: pysdk3\ntimeout: 10s\nfunctions:\n"
        + fn("slow", "sleep")
        + "routes:\n  - http: POST /slow\n    sequence: [slow]\n"
    )
    c = chain_of(spec)
    (pid,) = c.instances()
    time.sleep(0.5)
    before = _ticks(pid)
    time.sleep(2)
    used = _ticks(pid) - before
    assert used <= 3, f"an idle Python instance used {used} ticks in 2 s"
    # The function says when it holds the request, and holds it a minute: only the kill ends
    # it within the chain's timeout.
    answers: list[tuple[int, str]] = []
    t = threading.Thread(target=lambda: answers.append(post(c.url + "/slow", b"hold")))
    t.start()
    c.wait_for("pyfn: holding hold", 30, "the Python instance holding the request")
    os.kill(pid, signal.SIGKILL)
    t.join(30)
    assert answers and answers[0][0] == 502, answers
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and [p for p in c.instances() if p != pid] == []:
        time.sleep(0.05)
    assert post(c.url + "/slow", b"again") == (200, "AGAIN")


def test_a_fused_group_loads_a_module_per_function_into_one_interpreter() -> None:
    """``fuse: [[upper, exclaim]]`` over two ``runtime: python`` functions, one module each:
    one interpreter (one instance) runs both steps, the hop between them a call on the same
    request; an error in the second step names it."""
    folder = Path(tempfile.mkdtemp(prefix="zerohop-pyfused-"))
    folder.chmod(0o755)
    c = None
    try:
        (folder / "shout.py").write_text(
            "import os, zerohop\n\n"
            "def upper(req: zerohop.Request) -> None:\n"
            "    with req.body as body:\n"
            "        body[:] = bytes(body).upper()\n\n"
            "def pid(req: zerohop.Request) -> bytes:\n"
            "    return str(os.getpid()).encode()\n"
        )
        (folder / "bang.py").write_text(
            "import os, zerohop\n\n"
            "def exclaim(req: zerohop.Request) -> bytes:\n"
            "    with req.body as body:\n"
            "        data = bytes(body)\n"
            "    if data == b'NO':\n"
            "        raise zerohop.HandlerError(422, 'refusing ' + req.function)\n"
            "    if data.isdigit():\n"
            "        return data + b'=' + str(os.getpid()).encode()\n"
            "    return data + b'!'\n"
        )
        for f in ("shout.py", "bang.py"):
            (folder / f).chmod(0o644)
        common = f'interpreter: "{_python()}", env: {{ PYTHONPATH: "{PACKAGE_DIR}" }}'
        spec = (
            "name: pyfused\nfunctions:\n"
            f'  upper: {{ runtime: python, handler: "shout:upper", {common} }}\n'
            f'  exclaim: {{ runtime: python, handler: "bang:exclaim", {common} }}\n'
            f'  pid: {{ runtime: python, handler: "shout:pid", {common} }}\n'
            f'  pid2: {{ runtime: python, handler: "bang:exclaim", {common} }}\n'
            "routes:\n  - http: POST /hello\n    sequence: [upper, exclaim]\n"
            "  - http: POST /pids\n    sequence: [pid, pid2]\n"
            "fuse:\n  - [upper, exclaim]\n  - [pid, pid2]\n"
        )
        c = Chain(folder, spec)
        assert post(c.url + "/hello", b"hello fused") == (200, "HELLO FUSED!")
        assert post(c.url + "/hello", b"no") == (422, "function 'exclaim': refusing exclaim\n")
        # Both steps of a group ran in one process.
        status, text = post(c.url + "/pids", b"")
        first, _, second = text.partition("=")
        assert (status, first) == (200, second), text
        assert len(c.instances()) == 2, "one instance per group"
    finally:
        if c is not None:
            c.stop()
        shutil.rmtree(folder, ignore_errors=True)
