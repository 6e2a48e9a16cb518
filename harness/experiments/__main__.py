"""``python -m harness.experiments claims DIR [--quick] [--only C3,C4]`` (see :mod:`.run`)."""
import sys

from harness.experiments.run import main

sys.exit(main())
