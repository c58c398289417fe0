#!/usr/bin/env bash
# Prints the plain manifests of the default install (release probe-runner in namespace
# probe-runner) for clusters without Helm, rendered from helm/probe-runner:
#   bash k8s/generate.sh > k8s/probe-runner.yaml
# tests/integration/test_chart.py fails when the file is not what this prints.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
helm="${HELM:-${PROBE_RUNNER_CACHE:-$HOME/.cache/probe-runner}/tools/helm-4.1.4/helm}"
cat <<'HEAD'
# probe-runner, plain manifests: GENERATED from helm/probe-runner by k8s/generate.sh with the
# chart's default values (release probe-runner, namespace probe-runner). Do not edit; change the
# chart and regenerate. Before applying, create the provider credentials Secret "provider" (key api-key)
# and set the bucket in ConfigMap probe-runner-settings (RUNNER_STORE, RUNNER_S3__*), and create
# the gateway's token key (Helm makes it; a plain manifest cannot hold a random value):
#   kubectl -n probe-runner create secret generic probe-runner-gateway \
#     --from-literal=token-secret="$(openssl rand -hex 32)"
# or render the chart yourself with your values: helm template probe-runner helm/probe-runner -n probe-runner -f mine.yaml
---
apiVersion: v1
kind: Namespace
metadata:
  name: probe-runner
  labels:
    # Every pod of the install and every session pod meets the restricted Pod Security Standard.
    pod-security.kubernetes.io/enforce: restricted
    pod-security.kubernetes.io/enforce-version: latest
HEAD
"$helm" template probe-runner "$here/../helm/probe-runner" --namespace probe-runner --skip-tests \
  --set gateway.existingSecret=probe-runner-gateway --set provider.credentialsSecret=provider
