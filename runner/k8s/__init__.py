"""The Kubernetes executor: pure manifest builders, the one module that talks to the API
server, the session pod's own entry points, and the controller that drives them."""
