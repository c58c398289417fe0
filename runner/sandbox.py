"""Where a session finds its things, as it sees them: the same for every session on both
executors (bwrap binds them there, the pod mounts them there), so identical calls get identical
identities in the transcript, and a stream names paths the transform reads the same way
whichever executor captured it."""

WORKSPACE = "/workspace"  # the sealed workspace, read-write; the harness's working directory
CONFIG_DIR = "/run/probe/config"  # the CLI's HOME and CLAUDE_CONFIG_DIR, read-write, fresh per session
