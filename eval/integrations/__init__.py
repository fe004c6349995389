"""The benchmark inside other tools: inspect-ai's tasks and its logs' import, PrefMatcher as a TRL reward."""
