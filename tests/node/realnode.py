"""One real Kubernetes node on this machine, for tests/node/ and bench/.

The control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, built by
tests/cluster/build.sh) runs as host processes; the node (containerd + runc with the CRI
plugin, the kubelet, kube-proxy and kube-router's NetworkPolicy controller, built by
tests/node/build.sh) runs in a network namespace of its own, reached over a veth pair, and a
private mount namespace (supervisor.py). Pods get addresses from the CNI reference plugins
(bridge + host-local + portmap) on a bridge inside that namespace, so every iptables rule
kube-proxy and kube-router write, every bridge and every pod network namespace is the node's,
not the host's.

What the host sees, and what ``stop`` removes: one network namespace ``prn-<id>`` and its veth
(addresses 10.<a>.<b>.1/.3/.4 on the host side), one cgroup ``prn-<id>`` in each cgroup v1
hierarchy (the kubelet's cgroupRoot), the processes, and files under the work directory.
The host's cgroup mounts, sysctls and iptables are not touched.

Addresses, in a /29 picked per run so two runs never collide:
  .1  the host side: kube-apiserver :6443 and any test service (moto, ...)
  .2  the node (kubelet :10250)
  .3  "the provider": a second host address, for the scripted provider over TLS
  .4  "another host": a third host address, for routes that must not open
"""
from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import json
import os
import secrets
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ports import free_port  # tests/ is on the path (tests/conftest.py, bench/realnode.py)
from support.containerd import config_head
from support.waiting import until

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
POD_CIDR = "10.244.0.0/16"
NODE_POD_CIDR = "10.244.0.0/24"  # the controller-manager's first /24 of POD_CIDR
SERVICE_CIDR = "10.96.0.0/16"
DNS_SERVICE_IP = "10.96.0.10"
API_SERVICE_IP = "10.96.0.1"
NODE_NAME = "prn-node"
CGROUP_ROOT = Path("/sys/fs/cgroup")
REGISTRY = Path(os.environ.get("TMPDIR", "/tmp")) / "probe-runner-real-nodes"


def _run(*argv: str, check: bool = True, timeout: float = 60, **kw: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


# ---- PKI ---------------------------------------------------------------------------------

class Pki:
    """A throwaway cluster CA and the certificates the components present, as kubeadm makes
    them (same subjects and groups), written as PEM files under ``root``."""

    def __init__(self, root: Path) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec, rsa
        from cryptography.x509.oid import NameOID

        self._x509, self._hashes, self._ser, self._ec, self._oid = x509, hashes, serialization, ec, NameOID
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.ca_key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "probe-runner-node-ca")])
        now = dt.datetime.now(dt.UTC)
        self.ca_cert = (
            x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(self.ca_key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
            .sign(self.ca_key, hashes.SHA256())
        )
        self.ca = self._write("ca.crt", self.ca_cert.public_bytes(serialization.Encoding.PEM))
        # The service-account signing key pair (RSA: the apiserver's default algorithms).
        sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.sa_key = self._write("sa.key", sa.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        self.sa_pub = self._write("sa.pub", sa.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))

    def _write(self, name: str, data: bytes) -> Path:
        path = self.root / name
        path.write_bytes(data)
        path.chmod(0o600)
        return path

    def issue(self, name: str, cn: str, orgs: Sequence[str] = (), *, server: bool = False,
              dns: Sequence[str] = (), ips: Sequence[str] = ()) -> tuple[Path, Path]:
        x509, NameOID = self._x509, self._oid
        key = self._ec.generate_private_key(self._ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
        now = dt.datetime.now(dt.UTC)
        usage = [x509.ExtendedKeyUsageOID.SERVER_AUTH] if server else [x509.ExtendedKeyUsageOID.CLIENT_AUTH]
        builder = (
            x509.CertificateBuilder().subject_name(x509.Name(attrs)).issuer_name(self.ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        )
        if dns or ips:
            sans = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.ca_key, self._hashes.SHA256())
        crt = self._write(f"{name}.crt", cert.public_bytes(self._ser.Encoding.PEM))
        keyf = self._write(f"{name}.key", key.private_bytes(
            self._ser.Encoding.PEM, self._ser.PrivateFormat.PKCS8, self._ser.NoEncryption()))
        return crt, keyf

    def kubeconfig(self, name: str, server: str, cn: str, orgs: Sequence[str] = ()) -> Path:
        crt, key = self.issue(name, cn, orgs)
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "node",
            "clusters": [{"name": "node", "cluster": {"server": server, "certificate-authority": str(self.ca)}}],
            "users": [{"name": name, "user": {"client-certificate": str(crt), "client-key": str(key)}}],
            "contexts": [{"name": "node", "context": {"cluster": "node", "user": name}}],
        }
        path = self.root / f"{name}.kubeconfig"
        path.write_text(json.dumps(config, indent=1))
        return path


# ---- host network --------------------------------------------------------------------------

def _pick_subnet() -> ipaddress.IPv4Network:
    """A /29 in 10.128.0.0/9 that no address or route of the host touches."""
    used = []
    for line in _run("ip", "-4", "-o", "addr").stdout.splitlines() + _run("ip", "-4", "route").stdout.splitlines():
        for word in line.split():
            with contextlib.suppress(ValueError):
                used.append(ipaddress.ip_network(word, strict=False))
    for _ in range(100):
        net = ipaddress.ip_network(f"10.{128 + secrets.randbelow(100)}.{secrets.randbelow(256)}.{8 * secrets.randbelow(32)}/29")
        if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
            return net
    raise RuntimeError("no free /29 found in 10.128.0.0/9")


def _cgroup_hierarchies() -> list[Path]:
    """The cgroup v1 hierarchies, the named systemd one included (the kubelet checks its
    cgroupRoot in each); not cgroup2, which this host mounts beside them unused."""
    return [p for p in sorted(CGROUP_ROOT.iterdir())
            if p.is_dir() and p.name != "unified" and (p / "cgroup.procs").exists()]


def _all_hierarchies() -> list[Path]:
    """The cgroup v1 hierarchies and, where this host mounts it beside them, the cgroup2 one
    (``unified``): runc makes each container's group there too, under the kubelet's root."""
    unified = CGROUP_ROOT / "unified"
    return [*_cgroup_hierarchies(), *([unified] if (unified / "cgroup.controllers").exists() else [])]


def _remove_cgroup_tree(name: str) -> list[str]:
    """Kill every process under ``/<name>`` of every hierarchy (cgroup2's included), then
    remove the groups, deepest first. Returns what could not be removed."""
    left: list[str] = []
    freezer = CGROUP_ROOT / "freezer" / name
    for _ in range(50):
        pids: set[int] = set()
        for h in _all_hierarchies():
            top = h / name
            if not top.exists():
                continue
            for procs in top.rglob("cgroup.procs"):
                with contextlib.suppress(OSError):
                    pids.update(int(p) for p in procs.read_text().split())
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    del freezer
    for h in _all_hierarchies():
        top = h / name
        if not top.exists():
            continue
        dirs = sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda d: len(d.parts), reverse=True)
        for d in [*dirs, top]:
            for _ in range(20):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
            else:
                left.append(str(d))
    return left


# ---- the node ------------------------------------------------------------------------------

@dataclass
class RealNode:
    id: str
    work: Path
    net: ipaddress.IPv4Network
    kubeconfig: Path
    bins: dict[str, Path]
    ctr_socket: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    netns: str = ""
    host_if: str = ""
    _api: Any = None

    @property
    def host_ip(self) -> str:
        return str(self.net[1])

    @property
    def node_ip(self) -> str:
        return str(self.net[2])

    @property
    def provider_ip(self) -> str:
        return str(self.net[3])

    @property
    def other_ip(self) -> str:
        return str(self.net[4])

    @property
    def server(self) -> str:
        return f"https://{self.host_ip}:6443"

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([str(self.bins["kubectl"]), "--kubeconfig", str(self.kubeconfig), *args],
                              input=input, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
        return proc

    def apply(self, objs: Any) -> None:
        objs = objs if isinstance(objs, list) else [objs]
        self.kubectl("apply", "--server-side", "-f", "-",
                     input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}))

    def restricted_namespace(self, name: str) -> str:
        """A namespace enforcing the restricted Pod Security Standard, once its default
        ServiceAccount exists (pods are admitted only then)."""
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {
            "pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}})
        until(lambda: self.kubectl("-n", name, "get", "serviceaccount", "default", check=False).returncode == 0,
              30, f"namespace {name}'s default ServiceAccount", interval=0.2)
        return name

    def api_client(self) -> Any:
        if self._api is None:
            import kubernetes
            self._api = kubernetes.config.new_client_from_config(config_file=str(self.kubeconfig))
        return self._api

    def in_node(self, *argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run a command in the node's network namespace (iptables, ip, ctr)."""
        return _run("nsenter", f"--net=/run/netns/{self.netns}", *argv, check=check, timeout=timeout)

    def ctr(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return _run("ctr", "-a", str(self.ctr_socket), "-n", "k8s.io", *args, timeout=timeout)

    def logs(self, name: str, lines: int = 60) -> str:
        path = self.work / "logs" / f"{name}.log"
        if not path.exists():
            return f"(no {name} log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def all_logs(self, lines: int = 30) -> str:
        return "\n".join(f"---- {p.stem} ----\n{self.logs(p.stem, lines)}"
                         for p in sorted((self.work / "logs").glob("*.log")))


def _start(node: RealNode, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    log = open(node.work / "logs" / f"{name}.log", "ab")
    proc = subprocess.Popen([str(a) for a in argv], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env or {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                            start_new_session=True)
    node.procs[name] = proc
    return proc


def _wait(what: str, ok: Any, timeout: float, node: RealNode, interval: float = 0.3) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):
            if ok():
                return
        for name, proc in node.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited ({proc.returncode}) while waiting for {what}:\n{node.logs(name)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}\n{node.all_logs()}")
        time.sleep(interval)




def _https_ok(url: str, ca: Path, cert: tuple[Path, Path]) -> bool:
    import urllib.request
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    with urllib.request.urlopen(url, context=ctx, timeout=3) as r:
        return r.status == 200


def _start_control_plane(node: RealNode, pki: Pki, cp_bin: Path) -> None:
    etcd_client, etcd_peer = free_port(), free_port()
    _start(node, "etcd", [
        cp_bin / "etcd", "--name", "node0", "--data-dir", node.work / "etcd",
        "--listen-client-urls", f"http://127.0.0.1:{etcd_client}",
        "--advertise-client-urls", f"http://127.0.0.1:{etcd_client}",
        "--listen-peer-urls", f"http://127.0.0.1:{etcd_peer}",
        "--initial-advertise-peer-urls", f"http://127.0.0.1:{etcd_peer}",
        "--initial-cluster", f"node0=http://127.0.0.1:{etcd_peer}",
        "--listen-metrics-urls", "", "--log-level", "warn", "--quota-backend-bytes", str(2 << 30),
    ])
    serving = pki.issue("apiserver", "kube-apiserver", server=True,
                        dns=["kubernetes", "kubernetes.default", "kubernetes.default.svc",
                             "kubernetes.default.svc.cluster.local", "localhost"],
                        ips=[node.host_ip, API_SERVICE_IP, "127.0.0.1"])
    kubelet_client = pki.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", ["system:masters"])
    _start(node, "kube-apiserver", [
        cp_bin / "kube-apiserver",
        "--etcd-servers", f"http://127.0.0.1:{etcd_client}",
        "--bind-address", node.host_ip, "--advertise-address", node.host_ip, "--secure-port", "6443",
        "--tls-cert-file", serving[0], "--tls-private-key-file", serving[1],
        "--client-ca-file", pki.ca,
        "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
        "--service-account-key-file", pki.sa_pub, "--service-account-signing-key-file", pki.sa_key,
        "--service-cluster-ip-range", SERVICE_CIDR,
        "--authorization-mode", "Node,RBAC",
        "--enable-admission-plugins", "NodeRestriction",
        "--kubelet-client-certificate", kubelet_client[0], "--kubelet-client-key", kubelet_client[1],
        "--kubelet-certificate-authority", pki.ca,
        "--kubelet-preferred-address-types", "InternalIP",
        "--allow-privileged=false",
        "--endpoint-reconciler-type", "lease",
        "--profiling=false", "--v=1",
    ])
    admin_cert = pki.issue("admin-probe", "kubernetes-admin", ["system:masters"])
    _wait("kube-apiserver /readyz",
          lambda: _https_ok(f"{node.server}/readyz", pki.ca, admin_cert), 90, node)
    cm = pki.kubeconfig("controller-manager", node.server, "system:kube-controller-manager")
    _start(node, "kube-controller-manager", [
        cp_bin / "kube-controller-manager", "--kubeconfig", cm,
        "--authentication-kubeconfig", cm, "--authorization-kubeconfig", cm,
        "--bind-address", "127.0.0.1", "--secure-port", str(free_port()),
        "--service-account-private-key-file", pki.sa_key, "--root-ca-file", pki.ca,
        "--use-service-account-credentials",
        "--allocate-node-cidrs", "--cluster-cidr", POD_CIDR, "--node-cidr-mask-size", "24",
        "--service-cluster-ip-range", SERVICE_CIDR,
        "--controllers", "*,-bootstrapsigner,-tokencleaner",
        "--profiling=false", "--v=1",
    ])
    sched = pki.kubeconfig("scheduler", node.server, "system:kube-scheduler")
    _start(node, "kube-scheduler", [
        cp_bin / "kube-scheduler", "--kubeconfig", sched,
        "--authentication-kubeconfig", sched, "--authorization-kubeconfig", sched,
        "--bind-address", "127.0.0.1", "--secure-port", str(free_port()), "--profiling=false",
    ])


def _setup_network(node: RealNode) -> None:
    ns, host_if = node.netns, node.host_if
    _run("ip", "netns", "add", ns)
    _run("ip", "link", "add", host_if, "type", "veth", "peer", "name", f"n{host_if[1:]}")
    _run("ip", "link", "set", f"n{host_if[1:]}", "netns", ns)
    for ip in (node.host_ip, node.provider_ip, node.other_ip):
        _run("ip", "addr", "add", f"{ip}/{node.net.prefixlen}", "dev", host_if)
    _run("ip", "link", "set", host_if, "up")
    n = ["ip", "netns", "exec", ns]
    _run(*n, "ip", "link", "set", f"n{host_if[1:]}", "name", "eth0")
    _run(*n, "ip", "addr", "add", f"{node.node_ip}/{node.net.prefixlen}", "dev", "eth0")
    _run(*n, "ip", "link", "set", "lo", "up")
    _run(*n, "ip", "link", "set", "eth0", "up")
    _run(*n, "ip", "route", "add", "default", "via", node.host_ip)
    _run(*n, "sysctl", "-qw", "net.ipv4.ip_forward=1")
    _run(*n, "sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1")
    # Pods leave the node with its address, as a real node's off-cluster traffic does, so the
    # host answers the node without a route to the pod network.
    _run(*n, "iptables", "-t", "nat", "-A", "POSTROUTING", "-s", POD_CIDR, "!", "-d", POD_CIDR,
         "-o", "eth0", "-j", "MASQUERADE")


def _node_config(node: RealNode, pki: Pki, bins: dict[str, Path], gvisor: Path | None = None,
                 mirror: Callable[[str], str] | None = None) -> Path:
    w = node.work
    (w / "cni" / "net.d").mkdir(parents=True)
    (w / "cni" / "net.d" / "10-prn.conflist").write_text(json.dumps({
        "cniVersion": "0.4.0", "name": "prn",
        "plugins": [
            {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False, "hairpinMode": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": NODE_POD_CIDR}]],
                      "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(w / "cni" / "ipam")}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }, indent=1))
    sock = node.ctr_socket
    (w / "containerd.toml").write_text(config_head(w / "containerd" / "root", w / "containerd" / "state", sock) + f"""\
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10"
  enable_selinux = false
  disable_apparmor = true
  # The sandbox this runs in withholds CAP_SYS_RESOURCE, so no process may lower its
  # oom_score_adj (runc failed every pod sandbox on the kubelet's -998); clamp instead.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    discard_unpacked_layers = false
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
{_runsc_runtime(w, gvisor) if gvisor else ""}  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{w / 'cni' / 'net.d'}"
{mirror(node.host_ip) if mirror else ""}""")
    (w / "resolv.conf").write_text(f"nameserver {node.host_ip}\n")
    serving = pki.issue("kubelet-serving", NODE_NAME, server=True, dns=[NODE_NAME], ips=[node.node_ip])
    (w / "kubelet.yaml").write_text(json.dumps({
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupRoot": f"/{node.id}",
        "containerRuntimeEndpoint": f"unix://{sock}",
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(pki.ca)}},
        "authorization": {"mode": "Webhook"},
        "address": node.node_ip, "port": 10250, "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": 10248,
        "tlsCertFile": str(serving[0]), "tlsPrivateKeyFile": str(serving[1]),
        "clusterDNS": [DNS_SERVICE_IP], "clusterDomain": "cluster.local",
        "resolvConf": str(w / "resolv.conf"),
        "failSwapOn": False, "protectKernelDefaults": False,
        "podLogsDir": str(w / "pod-logs"),
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                         "nodefs.inodesFree": "1%"},
        "serializeImagePulls": False, "maxPods": 110,
        "fileCheckFrequency": "5s", "syncFrequency": "10s",
        "nodeStatusReportFrequency": "10s", "nodeStatusUpdateFrequency": "5s",
    }, indent=1))
    kubelet_kc = pki.kubeconfig("kubelet", node.server, f"system:node:{NODE_NAME}", ["system:nodes"])
    proxy_kc = pki.kubeconfig("kube-proxy", node.server, "system:kube-proxy")
    (w / "kube-proxy.yaml").write_text(json.dumps({
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(proxy_kc)},
        "mode": "iptables", "clusterCIDR": POD_CIDR, "hostnameOverride": NODE_NAME,
        "bindAddress": node.node_ip, "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        # Leave the host-wide conntrack table size alone (nf_conntrack_max is not per netns).
        "conntrack": {"maxPerCore": 0, "min": 0},
    }, indent=1))
    # kube-router reads pods, namespaces, nodes and NetworkPolicies; an identity of its own
    # bound to the ClusterRole its upstream DaemonSet manifest grants (applied below).
    router_kc = pki.kubeconfig("kube-router", node.server, "system:kube-router")
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(w)}
    if gvisor:  # containerd finds a runtime's shim on its PATH (containerd-shim-runsc-v1)
        env["PATH"] = f"{gvisor}:{env['PATH']}"
    (w / "logs").mkdir(exist_ok=True)
    daemons = [
        {"name": "containerd", "argv": ["containerd", "--config", str(w / "containerd.toml")],
         "env": env, "log": str(w / "logs" / "containerd.log"), "wait_for_path": str(sock)},
        {"name": "kubelet", "argv": [str(bins["kubelet"]), "--config", str(w / "kubelet.yaml"),
                                      "--kubeconfig", str(kubelet_kc), "--hostname-override", NODE_NAME,
                                      "--node-ip", node.node_ip, "--root-dir", KUBELET_ROOT, "--v=1"],
         "env": env, "log": str(w / "logs" / "kubelet.log")},
        {"name": "kube-proxy", "argv": [str(bins["kube-proxy"]), "--config", str(w / "kube-proxy.yaml"), "--v=1"],
         "env": env, "log": str(w / "logs" / "kube-proxy.log")},
    ]
    if "kube-router" in bins:
        daemons.append({"name": "kube-router", "argv": [
            str(bins["kube-router"]), "--kubeconfig", str(router_kc), "--hostname-override", NODE_NAME,
            "--run-firewall=true", "--run-router=false", "--run-service-proxy=false",
            "--enable-ipv4=true", "--enable-ipv6=false", "--metrics-port=0", "--health-port=0", "--v=1"],
            "env": env, "log": str(w / "logs" / "kube-router.log"), "start_when": str(w / "node-registered")})
    config = w / "supervisor.json"
    (w / "kubelet").mkdir(exist_ok=True)
    config.write_text(json.dumps({"state": str(w / "supervisor"), "daemons": daemons,
                                  "binds": [[str(w / "kubelet"), KUBELET_ROOT]]}, indent=1))
    return config


def oci_archive_of_binary(binary: Path, ref: str, out: Path, *, user: str = "65532:65532") -> Path:
    """An OCI image archive (as ``ctr images import`` takes) holding one static binary at
    ``/<name>`` as its entry point, for cluster add-ons built from Go modules (CoreDNS): no
    builder needed, and the same bytes give the same image ID."""
    import gzip
    import hashlib
    import io
    import tarfile

    def blob(data: bytes, media: str) -> tuple[dict, bytes]:
        return {"mediaType": media, "digest": "sha256:" + hashlib.sha256(data).hexdigest(), "size": len(data)}, data

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as t:
        info = t.gettarinfo(str(binary), arcname=binary.name)
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        info.mode = 0o755
        with open(binary, "rb") as f:
            t.addfile(info, f)
    diff_id = "sha256:" + hashlib.sha256(raw.getvalue()).hexdigest()
    layer, layer_bytes = blob(gzip.compress(raw.getvalue(), mtime=0), "application/vnd.oci.image.layer.v1.tar+gzip")
    config, config_bytes = blob(json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": [f"/{binary.name}"], "User": user},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }, sort_keys=True).encode(), "application/vnd.oci.image.config.v1+json")
    manifest, manifest_bytes = blob(json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config, "layers": [layer]}, sort_keys=True).encode(), "application/vnd.oci.image.manifest.v1+json")
    index = {"schemaVersion": 2, "manifests": [{**manifest, "annotations": {
        "org.opencontainers.image.ref.name": ref, "io.containerd.image.name": ref}}]}
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w") as t:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", json.dumps(index).encode())
        for d, data in ((layer, layer_bytes), (config, config_bytes), (manifest, manifest_bytes)):
            add("blobs/sha256/" + d["digest"].split(":", 1)[1], data)
    tmp.replace(out)
    return out


COREDNS_IMAGE = "registry.k8s.io/coredns/coredns:probe-runner-test"


def router_rbac() -> list[dict]:
    """What kube-router's NetworkPolicy controller reads (its upstream ClusterRole, less what
    the routing and service-proxy controllers need), bound to the identity of its client
    certificate. Applied before the node starts: kube-router exits when its caches cannot sync."""
    read = ["get", "list", "watch"]
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "system:kube-router"},
         "rules": [{"apiGroups": [""], "resources": ["namespaces", "pods", "services", "nodes", "endpoints"], "verbs": read},
                   {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": read},
                   {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": read},
                   {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "system:kube-router"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:kube-router"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:kube-router"}]},
    ]


def cluster_dns(hosts: dict[str, str]) -> list[dict]:
    """Cluster DNS: CoreDNS serving cluster.local and ``hosts`` (name -> address, such as the
    provider's); nothing is forwarded, so no other name resolves. As in a kubeadm cluster:
    Service kube-dns at DNS_SERVICE_IP, pods labelled k8s-app=kube-dns in kube-system."""
    labels = {"k8s-app": "kube-dns"}
    corefile = (".:53 {\n    errors\n    health :8080\n    ready :8181\n"
                "    kubernetes cluster.local in-addr.arpa ip6.arpa {\n        pods insecure\n"
                "        fallthrough in-addr.arpa ip6.arpa\n    }\n"
                "    hosts {\n" + "".join(f"        {ip} {name}\n" for name, ip in sorted(hosts.items())) +
                "    }\n    cache 5\n}\n")
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "coredns", "namespace": "kube-system"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "system:coredns"},
         "rules": [{"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": ["list", "watch"]},
                   {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "system:coredns"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
         "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": "kube-system"}]},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "coredns", "namespace": "kube-system"},
         "data": {"Corefile": corefile}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "coredns", "namespace": "kube-system", "labels": labels},
         "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
             "metadata": {"labels": labels},
             "spec": {"serviceAccountName": "coredns", "dnsPolicy": "Default",
                      # Port 53 as a non-root user without capabilities: the pod's own network
                      # namespace lets unprivileged ports start there (a safe sysctl). Port 53
                      # matters: policies match the pod's port, and the chart opens 53.
                      "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                          "seccompProfile": {"type": "RuntimeDefault"},
                                          "sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "53"}]},
                      "containers": [{
                          "name": "coredns", "image": COREDNS_IMAGE, "imagePullPolicy": "Never",
                          "args": ["-conf", "/etc/coredns/Corefile"],
                          "ports": [{"containerPort": 53, "protocol": "UDP", "name": "dns"},
                                    {"containerPort": 53, "protocol": "TCP", "name": "dns-tcp"}],
                          "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                              "capabilities": {"drop": ["ALL"]}},
                          "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}, "periodSeconds": 2},
                          "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": True}]}],
                      "volumes": [{"name": "config", "configMap": {"name": "coredns"}}]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": labels},
         "spec": {"clusterIP": DNS_SERVICE_IP, "selector": labels,
                  "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                            {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53}]}},
    ]


def _node_ready(node: RealNode) -> bool:
    out = node.kubectl("get", "node", NODE_NAME, "-o", "json", check=False)
    if out.returncode != 0:
        return False
    conds = {c["type"]: c["status"] for c in json.loads(out.stdout)["status"].get("conditions", [])}
    return conds.get("Ready") == "True"


GVISOR_RUNTIME_CLASS = "gvisor"
# The kubelet's root in the node's mount namespace, bound to the node's work directory's kubelet/:
# gVisor's shim looks for a pod's volumes under /var/lib/kubelet/pods alone (its mount hints).
KUBELET_ROOT = "/var/lib/kubelet"


def _runsc_runtime(w: Path, gvisor: Path) -> str:
    """containerd's ``runsc`` runtime: gVisor's shim, which runs every container of a pod in
    the pod's one sandbox, with runsc's flags from runsc.toml. Platform systrap (gVisor's
    default; no KVM here); the sandbox takes over the pod's network namespace as the CNI
    plugins made it, so the node's NetworkPolicy enforcement meets its packets on the
    bridge as it does runc's."""
    (w / "runsc.toml").write_text(f"""binary_name = "{gvisor / 'runsc'}"
root = "{w / 'runsc' / 'root'}"
log_level = "info"
log_path = "{w / 'logs' / 'runsc-shim-%ID%.log'}"
[runsc_config]
  platform = "systrap"
  debug-log = "{w / 'logs' / 'runsc' / '%ID%.%COMMAND%.log'}"
""")
    (w / "logs" / "runsc").mkdir(parents=True, exist_ok=True)
    return f"""    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc]
      runtime_type = "io.containerd.runsc.v1"
      # The pod's gVisor annotations (its mount hints) into the OCI specs the shim reads
      pod_annotations = ["dev.gvisor.*"]
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc.options]
        TypeUrl = "io.containerd.runsc.v1.options"
        ConfigPath = "{w / 'runsc.toml'}"
"""


@contextlib.contextmanager
def start_node(cp_bin: Path, node_bin: Path, base: Path, images: Sequence[Path] = (),
               hosts: dict[str, str] | None = None, gvisor: Path | None = None,
               mirror: Callable[[str], str] | None = None) -> Iterator[RealNode]:
    """Start the control plane and the node; import ``images`` (OCI archives) into the
    node's containerd; start cluster DNS with ``hosts`` (name -> address; the names
    ``provider`` and ``other`` stand for the node's provider and other-host addresses); yield
    once the node is Ready and DNS answers. Everything is stopped on exit. With ``gvisor``
    (build-gvisor.sh's bin directory), containerd has a second runtime, ``runsc``, and the
    RuntimeClass ``gvisor`` names it (GVISOR_RUNTIME_CLASS). ``mirror``: the host-side
    address -> containerd's registry configuration (registry.containerd_mirror), where the
    node is to pull images from a registry of this machine."""
    if os.geteuid() != 0:
        raise RuntimeError("a real node needs root (network and mount namespaces, cgroups)")
    ident = f"prn-{secrets.token_hex(3)}"
    work = base / ident
    (work / "logs").mkdir(parents=True)
    bins = {b: cp_bin / b for b in ("kubectl",)}
    for b in ("kubelet", "kube-proxy", "kube-router"):
        if (node_bin / b).exists():
            bins[b] = node_bin / b
    node = RealNode(id=ident, work=work, net=_pick_subnet(), kubeconfig=work / "pki" / "admin.kubeconfig",
                    bins=bins, ctr_socket=work / "containerd.sock", netns=ident, host_if=f"h{ident[4:]}")
    REGISTRY.mkdir(parents=True, exist_ok=True)
    entry = REGISTRY / f"{ident}.json"
    entry.write_text(json.dumps({"owner_pid": os.getpid(), "id": ident, "work": str(work)}))
    try:
        _setup_network(node)
        pki = Pki(work / "pki")
        pki.kubeconfig("admin", f"https://{node.host_ip}:6443", "kubernetes-admin", ["system:masters"])
        _start_control_plane(node, pki, cp_bin)
        config = _node_config(node, pki, bins, gvisor, mirror)
        node.apply(router_rbac())
        for h in _cgroup_hierarchies():
            (h / ident).mkdir()
            if h.name == "cpuset":
                for f in ("cpuset.cpus", "cpuset.mems"):
                    (h / ident / f).write_text((h / f).read_text())

        def join_cgroups() -> None:
            for h in _cgroup_hierarchies():
                (h / ident / "cgroup.procs").write_text(str(os.getpid()))

        log = open(work / "logs" / "supervisor.log", "ab")
        node.procs["supervisor"] = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{ident}", "unshare", "--mount", "--propagation", "private",
             sys.executable, str(HERE / "supervisor.py"), str(config)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=join_cgroups, start_new_session=True)
        _wait("containerd's socket", node.ctr_socket.exists, 60, node)
        for archive in images:
            node.ctr("images", "import", str(archive))
        coredns = oci_archive_of_binary(node_bin / "coredns", COREDNS_IMAGE, work / "coredns.oci.tar")
        node.ctr("images", "import", str(coredns))
        _wait(f"node {NODE_NAME} Ready", lambda: _node_ready(node), 180, node, interval=1)
        (work / "node-registered").touch()  # kube-router needs the Node object
        if "kube-router" in bins:
            _wait("kube-router's policy chains", lambda: node.in_node(
                "iptables", "-S", "KUBE-ROUTER-FORWARD", check=False).returncode == 0, 90, node)
        if gvisor:
            node.apply({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": GVISOR_RUNTIME_CLASS},
                        "handler": "runsc"})
        named = {"provider": node.provider_ip, "other": node.other_ip}
        node.apply(cluster_dns({k: named.get(v, v) for k, v in (hosts or {}).items()}))
        node.kubectl("-n", "kube-system", "rollout", "status", "deployment/coredns", "--timeout=120s", timeout=130)
        yield node
    finally:
        _stop(node)
        entry.unlink(missing_ok=True)


def reap_orphans() -> None:
    """End what a killed earlier run left: its processes (found by its work directory in
    their command lines), its cgroups, its network namespace and veth."""
    if not REGISTRY.exists():
        return
    for entry in REGISTRY.glob("prn-*.json"):
        info = json.loads(entry.read_text())
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(info["owner_pid"], 0)
            continue  # its owner still runs
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                with contextlib.suppress(OSError):
                    if info["work"].encode() in (proc / "cmdline").read_bytes():
                        os.kill(int(proc.name), signal.SIGKILL)
        _remove_cgroup_tree(info["id"])
        _run("ip", "netns", "del", info["id"], check=False)
        _run("ip", "link", "del", f"h{info['id'][4:]}", check=False)
        entry.unlink(missing_ok=True)


def _stop(node: RealNode) -> None:
    sup = node.procs.pop("supervisor", None)
    if sup is not None and sup.poll() is None:
        sup.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            sup.wait(timeout=40)
    left = _remove_cgroup_tree(node.id)
    if sup is not None and sup.poll() is None:
        sup.kill()
        sup.wait()
    for name in reversed(list(node.procs)):
        proc = node.procs[name]
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    _run("ip", "netns", "del", node.netns, check=False)
    _run("ip", "link", "del", node.host_if, check=False)
    if left:
        print(f"realnode: cgroups left behind: {left}", file=sys.stderr)
