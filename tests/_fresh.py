"""Fresh processes for the CPU step-peak tests, without a torch + DGL import each.

A resident high-water mark is only sound in a process whose heap did not grow before the measurement starts
(a long pytest process has reused pages lying around). A new interpreter gives that, but each one imports torch,
DGL and dgl_exact again (3-7 s of CPU). Instead, one server process per test process imports them once and
does nothing else; each request is run in a child ``fork``\\ed from it: the child's heap is the server's, which
is what a new interpreter's is right after the same imports (its pages are shared with the server until written,
and counted resident either way). The server starts no threads of its own before it forks (torch's and OpenMP's
thread pools start on first use), so the child inherits no lock held by another thread.

``run_forked(code)`` returns the dict ``out`` that ``code`` fills; on a platform without ``fork`` it runs
``code`` in a new interpreter as before."""
from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import tempfile
import textwrap

# DGL where it is installed (CI's no-DGL environment runs the core's fresh-process tests too)
PRELUDE = ("import json, torch, dgl_exact\ntry:\n    import dgl\nexcept ModuleNotFoundError:\n    dgl = None\n"
           "from dgl_exact.memory import measure_step, prepare_cpu_peak\n")

_SERVER = PRELUDE + r"""
import os, sys, traceback
ready = sys.stdout
ready.write("ready\n"); ready.flush()
for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        status = 0
        try:
            scope = {"__name__": "__fresh__"}
            exec(request["code"], scope)
            with open(request["result"], "w") as f:
                json.dump(scope["out"], f)
        except BaseException:
            with open(request["error"], "w") as f:
                f.write(traceback.format_exc())
            status = 1
        finally:
            os._exit(status)
    _, wait_status = os.waitpid(pid, 0)
    ready.write(f"{os.waitstatus_to_exitcode(wait_status)}\n"); ready.flush()
"""

_server = None


def _start():
    global _server
    if _server is None or _server.poll() is not None:
        _server = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert _server.stdout.readline().strip() == "ready", "the fresh-process server did not start"
        atexit.register(_stop, _server)
    return _server


def _stop(server) -> None:
    if server.poll() is None:
        server.stdin.close()
        server.wait(timeout=30)


def run_forked(code: str, timeout: int = 300) -> dict:
    """Run ``code`` (which fills a dict ``out``; :data:`PRELUDE`'s names are there) in a fresh process."""
    body = PRELUDE + "out = {}\n" + textwrap.dedent(code)
    if not hasattr(os, "fork"):
        proc = subprocess.run([sys.executable, "-c", body + "\nprint('RESULT ' + json.dumps(out))\n"],
                              capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1][len("RESULT "):])
    server = _start()
    with tempfile.TemporaryDirectory() as tmp:
        result, error = os.path.join(tmp, "out.json"), os.path.join(tmp, "error.txt")
        server.stdin.write(json.dumps({"code": body, "result": result, "error": error}) + "\n")
        server.stdin.flush()
        if not select.select([server.stdout], [], [], timeout)[0]:
            server.kill()
            raise AssertionError(f"the fresh process ran over {timeout} s")
        status = server.stdout.readline().strip()
        if status != "0":
            message = open(error).read()[-3000:] if os.path.exists(error) else f"exit status {status!r}"
            raise AssertionError(f"the fresh process failed:\n{message}")
        with open(result) as f:
            return json.load(f)
