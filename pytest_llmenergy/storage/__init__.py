"""Keeping results: run files (JSON, versioned), the storage folder, machine and commit info."""
