"""Broken on purpose: claim rounds the lease down to whole seconds."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mini_correct import *  # the correct queue; below, the one bug

base_claim = claim


def claim(r, lease_s):
    # BUG: a 0.5 s lease becomes 0 s (expired at once), a 1.9 s one 1 s
    return base_claim(r, int(lease_s))
