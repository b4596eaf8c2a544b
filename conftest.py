"""Repository-wide test configuration: the pytester fixture for integration tests."""

pytest_plugins = ["pytester"]
