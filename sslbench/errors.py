"""The errors we expect and explain: a bad config, a broken method folder, missing data, a diverged
run, an output that cannot be written, a file of the DAG that no longer reads back.

Their message says what to fix, so the CLI and the Snakefile print it alone, with exit status 1;
``SSLBENCH_DEBUG=1`` in the environment shows the traceback too. Any other exception is a bug and
keeps its traceback. Each subclass also keeps a builtin base (ValueError, OSError, ...), so code
that catches those still catches ours.
"""

from __future__ import annotations

import os
import traceback
from contextlib import contextmanager
from pathlib import Path

DEBUG_VARIABLE = "SSLBENCH_DEBUG"


class SslbenchError(Exception):
    """Base of the errors whose message is the whole story."""


class ConfigError(SslbenchError, ValueError):
    """A setting that cannot work: the message names the key, the file that set it and the fix."""


class UnreadableFileError(SslbenchError, ValueError):
    """A file the DAG wrote that does not read back: truncated, corrupted or missing. ``problem``:
    what is wrong with it, without its path and rebuild command (``file_problem``)."""

    problem = ""


def debug_enabled() -> bool:
    return os.environ.get(DEBUG_VARIABLE, "") not in ("", "0")


@contextmanager
def expected_errors(prefix: str, print_traceback: bool = False):
    """Our errors end the program with ``<prefix>: error: <message>`` on stderr and exit status 1
    (``SSLBENCH_DEBUG=1``: raised as they are, with their traceback). ``print_traceback``: print it here
    too, for a host that reports an exception without its traceback (Snakemake, for the Snakefile)."""
    try:
        yield
    except SslbenchError as err:
        if debug_enabled():
            if print_traceback:
                traceback.print_exc()
            raise
        raise SystemExit(f"{prefix}: error: {err}") from None


def rebuild_command(path: str | Path) -> str:
    """The snakemake call that rebuilds one output of the DAG (and what depends on it)."""
    relative = os.path.relpath(path)
    target = relative if not relative.startswith("..") else str(path)
    return f"snakemake --cores all --forcerun {target} (with the --configfile of your run)"


def unreadable(path: str | Path, what: str, err: BaseException) -> UnreadableFileError:
    """The error for a ``what`` (e.g. "checkpoint") at ``path`` that failed to load with ``err``."""
    if isinstance(err, FileNotFoundError):
        problem = "not found"
    else:  # the first sentence: torch appends a paragraph of advice to its own
        detail = str(err).split("\n")[0].split(". ")[0]
        problem = f"unreadable {what}, truncated or corrupted ({type(err).__name__}: {detail})"
    return file_problem(path, problem)


def file_problem(path: str | Path, problem: str) -> UnreadableFileError:
    """The error for a file of the DAG at ``path`` that cannot be used because of ``problem``."""
    error = UnreadableFileError(f"{path}: {problem}. Rebuild it: {rebuild_command(path)}")
    error.problem = problem
    return error
