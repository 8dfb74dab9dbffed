"""Runnable examples shipped with jaxpace (`python -m jaxpace.examples.train`)."""
