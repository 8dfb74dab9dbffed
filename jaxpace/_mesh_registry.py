"""Old import path of `jaxpace.topology.registry` (the same module object, not a copy)."""

import sys

from jaxpace.topology import registry

sys.modules[__name__] = registry
