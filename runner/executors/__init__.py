"""Executors run one sealed session and bring its stdout and changed files into the store.

Both executors return the same capture record, so the transform cannot tell them apart except
by what the record states about confinement.
"""
