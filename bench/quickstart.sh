#!/usr/bin/env bash
# The README's first command on a fresh machine, timed: a Debian 12 root made by debootstrap
# (the default variant: no Python, no bubblewrap, no CA certificates), this repository's files
# copied into /root/probe-runner, then `bash .ci/quickstart` run in it as a machine of its own (a
# mount and PID namespace pivoted to that root; not a chroot, in which the kernel refuses the
# user namespaces bubblewrap needs). Prints the quick start's own wall time.
#
#   sudo bash bench/quickstart.sh [WORKDIR]      # root: debootstrap, namespaces; about 1.5 min
#
# The host's extra CA certificates (/usr/local/share/ca-certificates) go into the fresh root, so
# a host behind a TLS-inspecting egress reaches the registries as its own tools do; nothing
# else of the host is used.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:-$(mktemp -d /tmp/quickstart-XXXXXX)}"
root="$work/root"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
[[ "$(id -u)" == 0 ]] || { echo "bench/quickstart.sh: run as root (debootstrap, namespaces)" >&2; exit 2; }

rm -rf "$root" && mkdir -p "$work"
debootstrap bookworm "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log"; exit 1; }
mkdir -p "$root/root/probe-runner" "$root/usr/local/share/ca-certificates"
cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/" 2>/dev/null || true
cp /etc/resolv.conf "$root/etc/resolv.conf"
git -C "$repo" ls-files -co --exclude-standard | grep -v '^runs/' | tar -C "$repo" -cf - -T - | tar -C "$root/root/probe-runner" -xf -

unshare --mount --pid --fork --propagation private bash -c "
  set -e
  mount --bind '$root' '$root'
  mount --rbind /dev '$root/dev'
  mount --rbind /sys '$root/sys'
  cd '$root' && mkdir -p .old && pivot_root . .old
  mount -t proc proc /proc
  umount -l /.old && rmdir /.old
  exec /usr/bin/env -i HOME=/root PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 TERM=dumb \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    bash -c 'cd /root/probe-runner && start=\$(date +%s%N) && bash .ci/quickstart \
      && ms=\$(( (\$(date +%s%N) - start) / 1000000 )) \
      && echo \"quickstart: \$((ms / 1000)).\$(((ms % 1000) / 100)) s on a fresh Debian 12\"'
"
