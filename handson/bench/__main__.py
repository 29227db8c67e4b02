"""`python -m handson.bench [--size small|full] [--only NAME ...] [--json]`."""

import sys

from handson.bench.run import main

sys.exit(main())
