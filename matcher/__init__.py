"""The metric: the prompts' data files and their rendering, answer parsing, label scores, precision, recall and F1. It
imports nothing of serving, eval or training: a client is handed to it."""
