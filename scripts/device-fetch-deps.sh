#!/usr/bin/env bash
# device-fetch-deps.sh: run HERE (a Debian 12 machine with network) before a call to the GPU
# machine: downloads the Debian packages that the GPU machine lacks (headers of jansson, PCRE2,
# libcurl, OpenSSL; libutf8proc and libmicrohttpd entirely; pkgconf) into .deps/, which git ignores
# (.git/info/exclude) and the call carries (`carry: [".deps"]`). scripts/device-env.sh unpacks them
# there. Bookworm's binaries need glibc 2.36, which Ubuntu 24.04's 2.39 satisfies.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps
grep -qx '/.deps/' .git/info/exclude 2>/dev/null || echo '/.deps/' >> .git/info/exclude
cd .deps
apt-get download libjansson-dev libjansson4 libpcre2-dev libpcre2-8-0 libutf8proc-dev libutf8proc2 \
  libmicrohttpd-dev libmicrohttpd12 libcurl4-openssl-dev libssl-dev pkgconf pkgconf-bin libpkgconf3
ls -la
