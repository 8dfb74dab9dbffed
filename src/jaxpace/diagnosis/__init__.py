"""The one culprit decision (ranks and groups), its persistence test and its statistics: used
by the report, `Pacer.stats()`, the sinks and the live view alike. Imports nothing of the
report, the runtime or the collectives."""
