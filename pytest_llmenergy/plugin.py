"""pytest entry point (work in progress)."""
