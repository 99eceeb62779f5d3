# device-env.sh: source this on the lent GPU machine (Ubuntu 24.04 with CUDA 13 but no -dev headers,
# no libmicrohttpd, no utf8proc). It unpacks the Debian packages that scripts/device-fetch-deps.sh
# put in .deps/ (carried with the call) into /tmp/lumen-deps (LM_DEPS_PREFIX), points the unversioned .so links of the
# -dev packages at the system's own copies where the system has the library, and sets pkg-config
# and the loader to look there. Sets LM_ROOT, LM_PREFIX, LM_LIBDIR and LM_PKG_CONFIG.
LM_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LM_PREFIX=${LM_DEPS_PREFIX:-/tmp/lumen-deps}
LM_LIBDIR=$LM_PREFIX/usr/lib/x86_64-linux-gnu
if [ ! -d "$LM_LIBDIR/pkgconfig" ]; then
  for f in "$LM_ROOT"/.deps/*.deb; do dpkg -x "$f" "$LM_PREFIX"; done
  for so in "$LM_LIBDIR"/lib*.so; do
    sys=$(ls /usr/lib/x86_64-linux-gnu/"$(basename "$so")".[0-9]* 2>/dev/null | head -1)
    if [ -n "$sys" ]; then ln -sf "$sys" "$so"; fi
  done
  # Dynamic linking needs no private requirements (libmicrohttpd.pc names gnutls, which has no .pc here).
  sed -i '/^Requires.private/d' "$LM_LIBDIR"/pkgconfig/*.pc
fi
export PKG_CONFIG_LIBDIR=$LM_LIBDIR/pkgconfig
export PKG_CONFIG_SYSROOT_DIR=$LM_PREFIX
export LD_LIBRARY_PATH=$LM_LIBDIR:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
if command -v pkg-config >/dev/null 2>&1; then LM_PKG_CONFIG=$(command -v pkg-config); else LM_PKG_CONFIG=$LM_PREFIX/usr/bin/pkgconf; fi
export LM_ROOT LM_PREFIX LM_LIBDIR LM_PKG_CONFIG
