"""The transform: the recorder's second half, stored streams in, transcripts out.

The word has this one meaning everywhere, the recorder contract's ("A transform filters that
stream into a transcript"): this package, the ``probe-runner transform`` command, the transform
Job in the cluster, and the last step of ``run``. Its steps, in the order data flows:

- ``events``: one session's stream and the files it left into one event (``answer``'s rule,
  the harness's init-line refusals (``Harness.init_refusals``) of a harness that did not start as the contract requires);
- ``intake``: each transcript confirmed as ``headwater probe record`` would before it is
  written;
- ``transcript`` (with ``yamlfast``): the transcript file, written and read;
- ``run``: the whole campaign, every recorded session and every (tier, arm), transcripts
  and ``refusals.json`` written to the store.

It reads only the store, never a live session (the contract's transform "reaches nothing").
"""
