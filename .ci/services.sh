#!/usr/bin/env bash
# Install and start the services the test suite needs: a Docker engine (Debian's docker.io), debootstrap
# (to make base images locally: no registry is reachable) and a local registry (Debian's docker-registry).
set -euo pipefail

need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
[ -x /usr/bin/docker-registry ] || need+=(docker-registry)
# kubectl for `kubectl kustomize` (Debian's kubernetes-client: kubectl 1.20, kustomize v2, which k8s/ is written for)
command -v kubectl >/dev/null 2>&1 || need+=(kubernetes-client)
# Compose: bookworm's docker.io 20.10 has no compose plugin; Debian's docker-compose (1.29, Python) reads compose.yaml
command -v docker-compose >/dev/null 2>&1 || docker compose version >/dev/null 2>&1 || need+=(docker-compose)
# A real browser for `verl-deploy report`'s test (tests/test_report.py): Debian's headless Chromium
command -v chromium-headless-shell >/dev/null 2>&1 || command -v chromium >/dev/null 2>&1 || need+=(chromium-headless-shell)
# Network namespaces as nodes for the multi-node tests (tests/netns_cluster.py): ip, iptables, unshare
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v iptables >/dev/null 2>&1 || need+=(iptables)
command -v unshare >/dev/null 2>&1 || need+=(util-linux)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if ! timeout 10 docker info >/dev/null 2>&1; then
  nohup dockerd >/tmp/dockerd.log 2>&1 &
  for _ in $(seq 60); do
    timeout 5 docker info >/dev/null 2>&1 && break
    sleep 1
  done
  timeout 10 docker info >/dev/null 2>&1 || { echo "dockerd did not start; see /tmp/dockerd.log" >&2; tail -20 /tmp/dockerd.log >&2; exit 1; }
fi
echo "docker engine $(docker version --format '{{.Server.Version}}') is up"

# Slurm: a real controller and node daemon on this host, for the Slurm target's tests (.ci/slurm.sh)
bash "$(dirname "$0")/slurm.sh"
