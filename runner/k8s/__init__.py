"""What the controller needs of Kubernetes, but the executor (runner/executors/kubernetes.py)
and what runs inside the pods (runner/entrypoints/): pure builders of the objects (manifests,
jobs, policy, egress, names, podstate), the one module that talks to the API server (api), the
watch cache (podcache), and the confinement check's routes and monitor (canary, confinement)."""
