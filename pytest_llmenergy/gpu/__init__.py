"""GPU settings as benchmark axes: apply, read back, restore; telemetry per trial."""
