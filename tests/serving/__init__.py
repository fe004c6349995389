"""Tests of `serving/`."""
