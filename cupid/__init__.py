"""Local, cost-free evaluation for the CUPID benchmark (COLM 2025) with a vLLM-served PrefMatcher judge.

Subpackages: `cupid.matcher` (the metric), `cupid.serving` (vLLM servers, the batched client, the request
cache), `cupid.eval` (the benchmark), `cupid.training` (rebuilding PrefMatcher).
"""
