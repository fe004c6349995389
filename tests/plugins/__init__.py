"""pytest plugins of the suite, registered in tests/conftest.py (`pytest_plugins`): the session server's controller,
the processes' environment, the order and the tier of the collected tests."""
