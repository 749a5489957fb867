"""The command line a golden file records in its metadata, with no path of the machine that made it.

Arguments that are absolute paths outside the repository (a reference's unpacked source package, a venv) are
written as `<outside>/` plus their last three components, e.g. `<outside>/llama_cpp_python-0.3.36/vendor/llama.cpp`;
paths inside the repository are written relative to its root. What the reference was stays readable; where it lay
on one machine does not leak into the repository.
"""
import os
import shlex
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def portable_arg(arg):
    head, sep, tail = arg.partition("=")
    if sep and tail.startswith("/"):  # --flag=/abs/path
        return head + "=" + portable_arg(tail)
    if not arg.startswith("/"):
        return arg
    path = os.path.normpath(arg)
    if path == ROOT or path.startswith(ROOT + os.sep):
        return os.path.relpath(path, ROOT)
    parts = [p for p in path.split(os.sep) if p]
    return "<outside>/" + "/".join(parts[-3:])


def recorded_command(script, argv=None):
    """`python tools/SCRIPT ARGS...` for this run, portable (see the module docstring)."""
    argv = sys.argv[1:] if argv is None else argv
    return " ".join(shlex.quote(a) for a in ["python", "tools/" + script] + [portable_arg(a) for a in argv])
