pytest_plugins = ["tests.support.engine", "tests.support.stack"]
