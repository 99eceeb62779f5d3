#!/usr/bin/env bash
# Installs the Debian packages lumen builds against, when any is missing.
set -euo pipefail
pkgs=(build-essential cmake pkg-config libjansson-dev libpcre2-dev libutf8proc-dev
      libmicrohttpd-dev libcurl4-openssl-dev libssl-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "lumen: installing Debian packages: ${missing[*]}" >&2
sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get install -y --no-install-recommends "${missing[@]}" ||
  { $sudo apt-get update && $sudo apt-get install -y --no-install-recommends "${missing[@]}"; }
