"""The single-file build of ``audit`` (contrib/pyz/build.py), made once per test process.

The engines' tests run this artefact, as the nodes of a fleet do, not the checkout.
"""

from __future__ import annotations

import atexit
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "contrib" / "pyz" / "build.py"


@cache
def audit_pyz() -> Path:
    """Build the zipapp with this environment's Python into a scratch directory (removed at
    exit, readable by every user: engines run it as others); return its path."""
    scratch = Path(tempfile.mkdtemp(prefix="ha-pyz-"))
    scratch.chmod(0o755)
    atexit.register(shutil.rmtree, scratch, True)
    target = scratch / "audit"
    subprocess.run([sys.executable, str(BUILD), "-o", str(target)], check=True,
                   capture_output=True, timeout=300)
    return target
