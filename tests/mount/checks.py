"""What the mount tests' python programs share: a check that records a
failure and goes on, so that one run reports every failed check, and the
name of an errno value.

A test puts tests/mount on PYTHONPATH and imports check, ename and
failures (the messages of the checks that failed, in order).
"""
import errno
import sys

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("  not ok:", msg, file=sys.stderr)
    return cond


def ename(e):
    return errno.errorcode.get(e, str(e))
