pytest_plugins = ["loom.testing.pytest_plugin"]
