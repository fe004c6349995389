"""Tests of `eval/`."""
