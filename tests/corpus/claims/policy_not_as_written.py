"""Broken on purpose: POLICY says duplicate, the code holds the claim."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the claims solution; below, the one bug

POLICY = "duplicate"   # BUG: the code holds
