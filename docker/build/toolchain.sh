#!/bin/sh
# A C/C++ compiler and Python's headers, where the variant has `compiler: true` (COMPILER=true): Triton builds its
# CUDA launcher with `cc` at first use on a GPU, inductor compiles C++ on the CPU. Shared by every image.
set -e
[ "$COMPILER" = true ] || exit 0
# Python's headers: the official python images have them; Debian's python3 needs libpython3-dev.
headers=$(python3 -c 'import os, sysconfig; print("" if os.path.exists(sysconfig.get_paths()["include"] + "/Python.h") else "libpython3-dev")')
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc g++ libc6-dev $headers
rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/apt /var/log/dpkg.log
find / -xdev -perm /6000 -type f -exec chmod a-s {} + 2>/dev/null || true
