"""Synthesis of new CUPID-style instances from personas (paper §3 and App. B), on local models.

Code lays down the structure (persona templates, factor slots, the 13-session template, which
sessions each instance keeps); models write the free text (descriptions, factors, preferences,
checklists, requests, dialogue turns), each answer parsed, validated and retried, through the
project's client and request cache.
"""
