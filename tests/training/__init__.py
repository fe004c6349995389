"""Tests of `training/`."""
