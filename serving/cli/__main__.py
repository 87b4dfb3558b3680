"""`python -m serving.cli`: the same as the `serving` console script."""

import sys

from serving.cli import main

sys.exit(main())
