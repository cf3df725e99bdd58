"""``python -m benchmarks.soak``: runs :func:`benchmarks.soak.runner.main`.

The soak lives in ``runner.py``, not here: its starters are spawned processes, which
import the module of their function by name, and a package's ``__main__`` is never
imported that way.
"""

import sys

from benchmarks.soak.runner import main

if __name__ == "__main__":
    sys.exit(main())
