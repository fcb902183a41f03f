"""A line of doctor's table: a check's name, its verdict and the detail behind it. The node checks,
the fabric, the all-reduce and the NCCL log's verdict all report in these.

    from .verdicts import FAIL, NA, OK, WARN, Check
    Check("memlock", OK, "unlimited")       # doctor exits 1 when any line is FAIL
"""

from __future__ import annotations

from typing import NamedTuple

OK, WARN, FAIL, NA = "ok", "warn", "FAIL", "n/a"


class Check(NamedTuple):
    """One line of doctor's table."""

    name: str
    verdict: str
    detail: str
