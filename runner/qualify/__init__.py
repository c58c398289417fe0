"""Qualifying a harness version (`probe-runner harness qualify`): run a CLI build under the
harness's real flags against the scripted provider, see what it sends each model (routes,
query strings, headers, body keys, betas), whether the recorder's conformance sessions
transform to the expected events through the gateway, and whether the CLI's own arithmetic of
cost agrees with the gateway's meter; then name every difference from what is qualified.

The layers, read top-down: ``fetch`` (a version from the npm registry), ``observe`` (what it
sends), ``conformance`` (sessions through the gateway, transformed), ``prices`` (its stated
cost against the meter), ``report`` (the comparison, pure)."""
