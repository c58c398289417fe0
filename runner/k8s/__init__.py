"""Everything Kubernetes-specific but the executor (runner/executors/kubernetes.py): pure
builders of the objects (manifests, jobs, policy, egress, names), the one module that talks to
the API server (api), the watch cache (podcache), the confinement check (canary, confinement),
and the entry points that run inside a session pod (pod; canary's main)."""
