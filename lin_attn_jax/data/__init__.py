"""Data for training and experiments.

- ``mqar``: Zoology's multi-query associative recall task (numpy).
"""
