"""The exec connections' TLS context (runner/k8s/api.py): websocket-client builds one per
connection from ssl options, loading the CA bundle each time, about a sixth of the controller's
CPU at 1,000 sessions at once (py-spy; bench/README.md, scale.py). It is built once, and
verifies as the options did: the server's certificate against the CA, its name checked."""

from __future__ import annotations

import ssl

import certifi

from runner.k8s.api import _tls_context


def test_the_exec_tls_context_is_built_once_and_verifies_the_api_server():
    _tls_context.cache_clear()
    first = _tls_context(certifi.where(), True, None, None)
    assert _tls_context(certifi.where(), True, None, None) is first
    assert _tls_context.cache_info().misses == 1
    assert (first.verify_mode, first.check_hostname) == (ssl.CERT_REQUIRED, True)
    assert first.get_ca_certs(), "the CA bundle was not loaded"
    unverified = _tls_context(None, True, None, None)  # verify_ssl false: as cert_reqs CERT_NONE did
    assert (unverified.verify_mode, unverified.check_hostname) == (ssl.CERT_NONE, False)
    no_name = _tls_context(certifi.where(), False, None, None)  # assert_hostname false
    assert (no_name.verify_mode, no_name.check_hostname) == (ssl.CERT_REQUIRED, False)
