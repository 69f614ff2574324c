#!/bin/sh
# Stand-in base images built from Debian packages, for machines that cannot pull from Docker Hub.
#
#   docker/local_bases.sh            # as root; needs docker (a running daemon) and debootstrap
#
# Builds (the Python base is left alone if it exists; FORCE=1 rebuilds it):
#   specdec-local/python:3.11-bookworm   Debian bookworm minbase + python3.11, python3-venv, ca-certificates
#                                        (stands in for python:3.11-slim-bookworm: build arg PYTHON_BASE_IMAGE)
#   specdec-local/postgres:15-bookworm   the above + Debian's postgresql-15 and an entry point that does what
#                                        the official postgres image's does (POSTGRES_USER/PASSWORD/DB,
#                                        /docker-entrypoint-initdb.d/*.sql); stands in for postgres:16
#                                        (compose variable POSTGRES_IMAGE). PostgreSQL 15, not 16: bookworm's.
# Then use them with
#   SPECDEC_PYTHON_BASE_IMAGE=specdec-local/python:3.11-bookworm POSTGRES_IMAGE=specdec-local/postgres:15-bookworm
# (docker/stack_test.py does this by itself when the public images cannot be pulled).
#
# Environment: DEBIAN_MIRROR (default http://deb.debian.org/debian), DEBOOTSTRAP_CACHE (package cache,
# default /var/cache/specdec-debootstrap), DOCKER (default docker).
set -eu

PY_IMAGE=${PY_IMAGE:-specdec-local/python:3.11-bookworm}
PG_IMAGE=${PG_IMAGE:-specdec-local/postgres:15-bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${DEBOOTSTRAP_CACHE:-/var/cache/specdec-debootstrap}
DOCKER=${DOCKER:-docker}
HERE=$(cd "$(dirname "$0")" && pwd)

have() { [ -z "${FORCE:-}" ] && $DOCKER image inspect "$1" > /dev/null 2>&1; }

if have "$PY_IMAGE"; then
  echo "local_bases: $PY_IMAGE exists"
else
  command -v debootstrap > /dev/null || { echo "local_bases: debootstrap is missing (apt-get install debootstrap)" >&2; exit 1; }
  [ "$(id -u)" = 0 ] || { echo "local_bases: debootstrap needs root" >&2; exit 1; }
  root=$(mktemp -d /tmp/specdec-rootfs.XXXXXX)
  trap 'rm -rf "$root"' EXIT
  mkdir -p "$CACHE"
  echo "local_bases: debootstrap bookworm into $root (log: $root.log)"
  debootstrap --variant=minbase --cache-dir="$CACHE" \
      --include=python3.11,python3-venv,python-is-python3,ca-certificates \
      bookworm "$root" "$MIRROR" > "$root.log" 2>&1 || { tail -20 "$root.log" >&2; exit 1; }
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | $DOCKER import \
      -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8' \
      -c 'CMD ["python3"]' - "$PY_IMAGE" > /dev/null
  rm -rf "$root" "$root.log"
  trap - EXIT
  echo "local_bases: built $PY_IMAGE"
fi

# Always built: Docker's layer cache makes this a no-op when nothing changed, and picks up a changed
# entry point.
$DOCKER build -q --build-arg BASE_IMAGE="$PY_IMAGE" \
    -f "$HERE/local-base/Dockerfile.postgres" -t "$PG_IMAGE" "$HERE/local-base" > /dev/null
echo "local_bases: built $PG_IMAGE"
