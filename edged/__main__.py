"""``python -m edged``: the same as the ``edged`` console script (the allocator re-exec uses this form)."""

import sys

from edged.cli.main import main

sys.exit(main())
