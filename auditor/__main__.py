"""``python -m auditor``: the ``audit`` command."""

import sys

from auditor.cli import main

sys.exit(main())
