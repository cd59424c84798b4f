#!/bin/sh
# The user and folders of every image (docker/Dockerfile and each runtime's Dockerfile): one place for both.
# A fixed numeric uid, so that Kubernetes' runAsNonRoot can verify it without a passwd lookup. No setuid or setgid
# binaries stay (su, mount, passwd, ...): nothing in the image needs to gain privileges.
set -e
useradd --uid 1000 --user-group --create-home --home-dir /home/verl --shell /usr/sbin/nologin verl
mkdir -p /workspace /cache/huggingface
chown verl:verl /workspace /cache /cache/huggingface
find / -xdev -perm /6000 -type f -exec chmod a-s {} + 2>/dev/null || true
