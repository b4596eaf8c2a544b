"""Faithful stand-ins for hardware this machine does not have."""
