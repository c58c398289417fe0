"""Executors run one sealed session and bring its stdout and changed files into the store,
behind one contract (base.py): local.py (bwrap on this host) and kubernetes.py (a pod per
session) return the same capture record, so the transform cannot tell them apart except by
what the record states about confinement.
"""
