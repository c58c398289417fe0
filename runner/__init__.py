"""probe-runner: a recorder for headwater probe campaigns.

The recorder drives each probe session from outside, keeps the harness's standard output as
the only source of what the session did, and turns it into transcripts that
``headwater probe record`` accepts (the recorder contract).
"""

__version__ = "0.1.0"
