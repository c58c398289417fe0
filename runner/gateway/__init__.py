"""The provider gateway (issue 15): the one holder of the provider key. Each session gets a
short-lived token bound to its attempt instead (``tokens``); the gateway (``server``) checks
it, forwards the Messages API paths the CLI uses to the provider, adds the key, streams the
answer back unchanged, and meters every call of each token from the provider's usage fields."""
