"""A real one-node SLURM on this machine for tests: munged, slurmctld and slurmd, started and stopped here.

Debian's slurm packages (installed by .ci/install-slurm.sh). The cluster's state, spool and logs lie in
one folder. Its config must be /etc/slurm/slurm.conf: the executor plugin's job step drops SLURM_* variables
(SLURM_CONF too) before its nested `srun`, which then finds no other config. So the test writes that file,
marked as its own, refuses to overwrite one it did not write, and removes it at the end. Daemons run in the
foreground as our children and are stopped by their own PIDs. A lock file serialises test sessions that
share the machine: the second one waits, then skips (SlurmBusy).
"""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

PARTITION = "sslbench_test"
SYSTEM_CONF = Path("/etc/slurm/slurm.conf")
LOCK = Path(tempfile.gettempdir()) / "sslbench-local-slurm.lock"
MARKER = "# written by sslbench tests/slurm_cluster.py; removed when the test's cluster stops"
DAEMONS = ("slurmctld", "slurmd", "munged")


class SlurmUnavailable(RuntimeError):
    """The local cluster did not come up (the message says why, with the daemons' log tails)."""


class SlurmBusy(SlurmUnavailable):
    """Another test session on this machine holds the local cluster."""


def why_unavailable() -> str | None:
    """None when a local cluster can be started here, else the reason."""
    missing = [d for d in DAEMONS if shutil.which(d) is None and not Path("/usr/sbin", d).exists()]
    if missing:
        return f"{', '.join(missing)} not installed (run .ci/install-slurm.sh as root)"
    if os.geteuid() != 0:
        return "the local SLURM runs its daemons as root; this test is not root"
    if SYSTEM_CONF.exists() and MARKER not in SYSTEM_CONF.read_text(errors="replace"):
        return f"{SYSTEM_CONF} exists and is not this test's: a real cluster's config is never overwritten"
    return None


def _binary(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_line() -> str:
    """This machine as slurmd sees it (`slurmd -C`): NodeName, CPUs, sockets, cores, RealMemory."""
    out = subprocess.run([_binary("slurmd"), "-C"], capture_output=True, text=True, check=True).stdout
    return next(line for line in out.splitlines() if line.startswith("NodeName="))


class LocalSlurm:
    """`with LocalSlurm(folder) as cluster:` a running one-node cluster; `cluster.env` for its clients."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.conf = SYSTEM_CONF
        self.processes: dict[str, subprocess.Popen] = {}
        self.lock = None
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.node = ""

    # -- lifecycle -------------------------------------------------------------------------------------
    def __enter__(self) -> LocalSlurm:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, timeout: float = 60, wait_for_lock: float = 180) -> None:
        reason = why_unavailable()
        if reason:
            raise SlurmUnavailable(reason)
        self._lock(wait_for_lock)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._ensure_munge()
        self._write_conf()
        self._spawn("slurmctld", [_binary("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        self._wait(
            lambda: self.run("scontrol", "ping").stdout.count("UP") > 0, "slurmctld answering", timeout
        )
        self._spawn("slurmd", [_binary("slurmd"), "-D", "-f", str(self.conf)])
        self._wait(lambda: self.node_state() == "idle", "the node idle in sinfo", timeout)

    def stop(self, timeout: float = 15) -> None:
        """Cancel what is left in our partition, then stop the daemons we started, newest first, by PID."""
        if self.processes.get("slurmctld") and self.processes["slurmctld"].poll() is None:
            self.run("scancel", "--partition", PARTITION)
        for name in reversed(list(self.processes)):
            process = self.processes.pop(name)
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        if self.lock is not None:  # the config is ours only while we hold the lock
            if self.conf.exists() and MARKER in self.conf.read_text(errors="replace"):
                self.conf.unlink()
            self.lock.close()  # releases the flock
            self.lock = None

    # -- queries ---------------------------------------------------------------------------------------
    def node_state(self) -> str:
        return self.run("sinfo", "-h", "-N", "-o", "%T").stdout.strip()

    def jobs(self) -> list[dict[str, str]]:
        """Every job slurmctld still remembers (MinJobAge), as `scontrol show job -o` key=value fields."""
        out = self.run("scontrol", "show", "job", "-o").stdout
        return [
            dict(field.split("=", 1) for field in line.split() if "=" in field)
            for line in out.splitlines()
            if line.startswith("JobId=")
        ]

    def log_tail(self, lines: int = 30) -> str:
        parts = []
        for name in ("slurmctld", "slurmd"):
            log = self.folder / f"{name}.log"
            if log.exists():
                parts.append(
                    f"--- {log}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
                )
        return "\n".join(parts)

    # -- internals -------------------------------------------------------------------------------------
    def _lock(self, wait: float) -> None:
        handle = open(LOCK, "a")
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.lock = handle
                return
            except BlockingIOError as err:
                if time.monotonic() > deadline:
                    handle.close()
                    raise SlurmBusy(
                        f"another test session holds {LOCK} (its local SLURM) after {wait:.0f} s"
                    ) from err
                time.sleep(1)

    def run(self, *command: str) -> subprocess.CompletedProcess:
        return subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=30)

    def _spawn(self, name: str, command: list[str], **kwargs) -> None:
        log = open(self.folder / f"{name}.stdout", "wb")
        self.processes[name] = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True, **kwargs
        )
        log.close()

    def _wait(self, ready, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [n for n, p in self.processes.items() if p.poll() is not None]
            if dead:
                raise SlurmUnavailable(
                    f"{', '.join(dead)} exited while waiting for {what}\n{self.log_tail()}"
                )
            if ready():
                return
            time.sleep(0.3)
        raise SlurmUnavailable(f"no {what} after {timeout:.0f} s\n{self.log_tail()}")

    def _munge_works(self) -> bool:
        encode = subprocess.run(["munge", "-n"], capture_output=True)
        decode = subprocess.run(["unmunge"], input=encode.stdout, capture_output=True)
        return encode.returncode == 0 and decode.returncode == 0

    def _ensure_munge(self) -> None:
        """Reuse a munged that already answers; else start one as the munge user (it refuses root)."""
        if shutil.which("munge") and self._munge_works():
            return
        munge = pwd.getpwnam("munge")
        for folder in ("/run/munge", "/var/lib/munge", "/var/log/munge"):  # /run is emptied at boot
            os.makedirs(folder, exist_ok=True)
            os.chown(folder, munge.pw_uid, munge.pw_gid)
        self._spawn(
            "munged",
            [_binary("munged"), "--foreground"],
            user=munge.pw_uid,
            group=munge.pw_gid,
            extra_groups=[],
            cwd="/",
        )
        self._wait(self._munge_works, "munge answering (munge -n | unmunge)", 15)

    def _write_conf(self) -> None:
        for sub in ("state", "spool"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        fields = dict(field.split("=", 1) for field in _node_line().split())
        self.node = fields["NodeName"]
        # The real CPUs, but at least 4 (config_overrides lets slurmd declare more than it has), so two
        # 2-thread jobs run side by side, as on a cluster node, even on a 2-core machine.
        cpus = max(4, int(fields["CPUs"]))
        node = f"NodeName={self.node} CPUs={cpus} RealMemory={fields['RealMemory']}"
        f = self.folder
        self.conf.parent.mkdir(parents=True, exist_ok=True)
        self.conf.write_text(f"""\
{MARKER}
ClusterName=sslbenchtest
SlurmctldHost={self.node}
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# finished jobs stay visible to squeue/scontrol this long: the executor plugin polls squeue
MinJobAge=300
StateSaveLocation={f}/state
SlurmdSpoolDir={f}/spool
SlurmctldPidFile={f}/slurmctld.pid
SlurmdPidFile={f}/slurmd.pid
SlurmctldLogFile={f}/slurmctld.log
SlurmdLogFile={f}/slurmd.log
SlurmdParameters=config_overrides
{node} State=UNKNOWN
PartitionName={PARTITION} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
""")
