"""Helpers the tests share: plain functions, classes and constants, and the session
fixtures of `tests/conftest.py` (`engine`, `stack`). Test modules import from here,
never from one another; fixtures shared within a folder live in its `conftest.py`."""
