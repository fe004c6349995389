"""Tests of `matcher/`."""
