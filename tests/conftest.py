pytest_plugins = ["tests.fixtures.engine", "tests.fixtures.stack"]
