"""The service layer: what the CLI's commands do, with the policies they share, returning typed
results (and reporting long work as events, ``runner.service.events``); nothing here prints.

- ``run``: running a campaign (every command that runs sessions), what it came to, the stop it records;
- ``outcome``: the exit-status policy, one table from what a command came to to its exit status;
- ``watch``: following a campaign's status until it is settled;
- ``ledger``: the ledger's commands and the resume rule;
- ``cluster``: submitting a campaign, and its resume and transform Jobs;
- ``fetch``: a session's stream (checked against its recorded digest) and the verified transcripts;
- ``stored``: a campaign as stored, and the lock and marks of a run.

Submodules are imported where used: the CLI loads only what its command needs.
"""
