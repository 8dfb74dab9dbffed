"""`python -m jaxpace` runs the `jaxpace` command."""

import sys

from jaxpace.cli import main

sys.exit(main())
