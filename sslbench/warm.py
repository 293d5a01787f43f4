"""A warm interpreter for jobs: a job forks from a process that has already imported torch.

Every job that builds a network would pay ~4 s importing torch, torchvision (which imports
torch._dynamo) and timm before its own work, often more than the work itself on the default, and a
protocol ~1 s importing scikit-learn. So a job command (``sslbench prepare|pretrain|extract|evaluate``)
first asks a per-user server to run it. The server has imported those packages once (``PRELOADED``)
and forks a child per request; the child takes the job's working directory, environment, ``sys.path``
and standard streams (passed over a Unix socket) and runs the command as the job's own process would:
the same code and kernels give the same bits (a test compares, and so does a whole default DAG). The
job's process waits for the child, forwards a signal it gets, and exits with the child's status.

Each child drops the server's few sslbench modules and imports the project afresh, so an edit is seen
by the next job. A server is shared only by jobs whose interpreter, ``sys.path``, kernel pins, thread
counts and installed preloaded packages are the same (``server_key``); where none is running, the job
starts one in the background and runs itself meanwhile. The server exits after ``SSLBENCH_WARM_IDLE``
seconds (default 30) without a job. ``SSLBENCH_WARM=0`` turns it off; it is off under torchrun, in
a SLURM job (a server started by one allocation would run another's jobs in its own) and where the
platform cannot pass file descriptors (not Linux). Its socket, lock and log are in
``socket_path``'s folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sslbench import kernels
from sslbench.provenance import LAUNCHED_BY

SWITCH, IDLE_VARIABLE, DIR_VARIABLE = "SSLBENCH_WARM", "SSLBENCH_WARM_IDLE", "SSLBENCH_WARM_DIR"
# The slow imports of the jobs: torch, torchvision and timm (networks), scikit-learn (the low-shot SVMs,
# the t-SNE maps, stratified subsets), scipy's optimiser (the linear probe), faiss (kNN, k-means), pandas
# and matplotlib's Agg canvas (collect, the report: torch too, for the E-step clusters of checkpoints),
# jsonschema (every protocol job checks its settings: 0.08 s to import, more than a kNN vote).
PRELOADED = (
    "numpy",
    "pandas",
    "matplotlib.figure",
    "matplotlib.backends.backend_agg",
    "torch",
    "torchvision",
    "timm",
    "sklearn.svm",
    "sklearn.model_selection",
    "sklearn.manifold",
    "scipy.optimize",
    "faiss",
    "jsonschema",
)
# What the preloaded packages read when they are imported: a server serves only jobs that agree.
IMPORT_ENVIRONMENT = (*kernels.PINNED, kernels.VARIABLE, *kernels.THREAD_VARIABLES)


def enabled() -> bool:
    return (
        os.environ.get(SWITCH, "1") != "0"
        and sys.platform == "linux"
        and "LOCAL_RANK" not in os.environ  # torchrun: its processes are its own
        and "SLURM_JOB_ID" not in os.environ  # a job of one allocation must not run inside another's
        and LAUNCHED_BY not in os.environ  # already the forked child: it runs the command itself
    )


def server_key() -> str:
    """What a job's process would import and with what, as a digest: the interpreter, sys.path, the
    import-time environment and the installed preloaded packages (their files' modification times)."""
    installed = {}
    for name in {name.split(".")[0] for name in PRELOADED}:
        spec = importlib.util.find_spec(name)
        installed[name] = [spec.origin, os.stat(spec.origin).st_mtime_ns] if spec and spec.origin else None
    state = {
        "python": sys.executable,
        "path": sys.path,
        "env": {name: os.environ.get(name) for name in IMPORT_ENVIRONMENT},
        "installed": installed,
        "server": os.stat(__file__).st_mtime_ns,
    }
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()[:20]


def socket_path(key: str) -> Path | None:
    """Where the server for ``key`` listens: in a folder only this user may enter (``SSLBENCH_WARM_DIR``,
    default ``$TMPDIR/sslbench-warm-<uid>``); None where that is not so, or the path is too long for a
    Unix socket (108 bytes)."""
    folder = Path(
        os.environ.get(DIR_VARIABLE) or Path(tempfile.gettempdir()) / f"sslbench-warm-{os.getuid()}"
    )
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    mode = folder.stat()
    path = folder / f"{key}.sock"
    private = mode.st_uid == os.getuid() and not mode.st_mode & 0o077
    return path if private and len(os.fsencode(path)) < 100 else None


# --------------------------------------------------------------------------- the job's side
def run(argv: list[str]) -> int | None:
    """Run ``sslbench argv`` in a child of the warm server and return its exit status, or None where
    no server is up (one is started for the next jobs) and the caller runs the command itself."""
    path = socket_path(server_key())
    if path is None:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(path))
    except OSError:
        conn.close()
        start_server(path)
        return None
    with conn:
        request = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "path": sys.path}
        socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [0, 1, 2])
        replies = conn.makefile("r")
        child = int(replies.readline())
        forward = lambda signum, frame: os.kill(child, signum)  # noqa: E731
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, forward)
        status = replies.readline()
    if not status:
        print(
            f"sslbench: the warm server's job {child} lost its server; rerun with {SWITCH}=0", file=sys.stderr
        )
        return 1
    return int(status)


def start_server(path: Path) -> None:
    """A detached server for ``path``; if another job starts one at the same time, one of them stays."""
    serve_here = (
        "import json, sys; sys.path[:] = json.loads(sys.argv[1]); from sslbench.warm import main; main()"
    )
    subprocess.Popen(
        [sys.executable, "-c", serve_here, json.dumps(sys.path), str(path)],  # our sys.path, not -m's cwd
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(path.with_suffix(".log"), "a"),  # why a server died, if one does
        start_new_session=True,
    )


# --------------------------------------------------------------------------- the server
def serve(path: Path) -> None:
    lock = open(path.with_suffix(".lock"), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return  # another server holds this key
    for name in PRELOADED:  # before listening: a job that connects gets a warm interpreter at once
        __import__(name)
    path.unlink(missing_ok=True)  # a socket left by a server that was killed
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(64)
    idle = float(os.environ.get(IDLE_VARIABLE, "30"))
    waiting: dict[int, socket.socket] = {}  # child pid: its job's connection
    hung_up: set[int] = set()  # children whose job's process went away: sent SIGTERM
    last = time.monotonic()
    try:
        while waiting or time.monotonic() - last < idle:
            watched = [conn for pid, conn in waiting.items() if pid not in hung_up]
            ready, _, _ = select.select([listener, *watched], [], [], 0.05)
            if listener in ready:
                conn, _ = listener.accept()
                pid = start_job(conn, listener, waiting)
                if pid:
                    waiting[pid] = conn
                last = time.monotonic()
            for pid, conn in waiting.items():  # a job's process that hangs up (killed) takes its child along
                if conn in ready and hung_up_on(conn):
                    os.kill(pid, signal.SIGTERM)
                    hung_up.add(pid)
            while waiting:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                conn, code = waiting.pop(pid), os.waitstatus_to_exitcode(status)
                hung_up.discard(pid)
                with conn, contextlib.suppress(OSError):  # its job's process may be gone
                    conn.sendall(f"{code if code >= 0 else 128 - code}\n".encode())
                last = time.monotonic()
    finally:
        path.unlink(missing_ok=True)


def hung_up_on(conn: socket.socket) -> bool:
    """Whether a job's process closed its end (it sends nothing after its request)."""
    try:
        return not conn.recv(1, socket.MSG_PEEK)
    except OSError:
        return True


def start_job(conn: socket.socket, listener: socket.socket, waiting: dict) -> int | None:
    """Fork the child that runs one job's request; in the server, return its pid."""
    try:
        message, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
        while not message.endswith(b"\n"):  # a long request may arrive in several pieces
            more = conn.recv(1 << 16)
            if not more:
                raise ValueError("the job hung up")
            message += more
        request = json.loads(message)
    except (OSError, ValueError):
        conn.close()
        return None
    pid = os.fork()
    if pid == 0:
        listener.close()
        for other in waiting.values():
            other.close()
        conn.close()
        run_child(request, fds)
    for fd in fds:
        os.close(fd)
    conn.sendall(f"{pid}\n".encode())
    return pid


def run_child(request: dict, fds: list[int]) -> None:
    """In the forked child: become the job's process, run the command, exit with its status."""
    code = 1
    try:
        server = os.getppid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.setsid()
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"], **{LAUNCHED_BY: str(server)})
        sys.path[:] = request["path"]
        for name in [m for m in sys.modules if m == "sslbench" or m.startswith("sslbench.")]:
            del sys.modules[name]  # the server's copy of this module: the job imports the tree as it is now
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        sys.stdin, sys.stdout, sys.stderr = (
            os.fdopen(0, "r", closefd=False),
            os.fdopen(1, "w", closefd=False),
            os.fdopen(2, "w", closefd=False),
        )
        from sslbench.cli import main

        try:
            code = main(request["argv"]) or 0
        except SystemExit as done:
            code = 0 if done.code is None else done.code if isinstance(done.code, int) else 1
            if not isinstance(done.code, int | None):  # a message: the interpreter would print it
                print(done.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> None:
    serve(Path(sys.argv[2]))
