"""`python -m scaling` is the `scaling` command."""

import sys

from scaling.cli.main import main

sys.exit(main())
