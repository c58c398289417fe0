"""What runs inside a pod: the session pod's reader and harness (pod.py) and the canary
(canary.py). The standard library and the runner's pure modules only: no Kubernetes client,
no store, so a pod starts fast and can reach nothing through them."""
