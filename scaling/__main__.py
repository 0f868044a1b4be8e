"""`python -m scaling` is the `scaling` command: `python -m scaling run [overrides]` runs one point as
`scaling run` does, with the same exit status."""

import sys

from scaling.cli.main import main

sys.exit(main())
