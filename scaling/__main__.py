"""`python -m scaling` is the `scaling` command."""

import sys

from scaling.cli import main

sys.exit(main())
