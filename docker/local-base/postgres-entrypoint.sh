#!/bin/sh
# Entry point of the stand-in postgres image (local-base/Dockerfile.postgres): the parts of the official
# image's docker-entrypoint.sh that docker/compose.yaml uses. Runs as root, drops to `postgres` with
# setpriv, which execs (no parent left behind), so the server is PID 1 and gets `docker stop`'s SIGINT.
set -eu

if [ "$(id -u)" = 0 ]; then
  mkdir -p "$PGDATA" /var/run/postgresql
  chown -R postgres:postgres "$PGDATA" /var/run/postgresql
  chmod 700 "$PGDATA"
  exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi

export HOME=/var/lib/postgresql
: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  if [ -z "${POSTGRES_PASSWORD:-}" ]; then
    echo "docker-entrypoint: POSTGRES_PASSWORD is not set; refusing to initialize the database" >&2
    exit 1
  fi
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
  initdb --username="$POSTGRES_USER" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 \
      --encoding=UTF8 --locale=C.UTF-8 -D "$PGDATA" > /dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
  # First start: a server on the Unix socket only, the database, the init scripts, stop.
  pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start > /dev/null
  if [ "$POSTGRES_DB" != postgres ]; then
    psql -v ON_ERROR_STOP=1 --no-psqlrc -U "$POSTGRES_USER" -d postgres -q \
        -c "CREATE DATABASE \"$POSTGRES_DB\""
  fi
  for f in /docker-entrypoint-initdb.d/*.sql; do
    [ -e "$f" ] || continue
    echo "docker-entrypoint: running $f"
    psql -v ON_ERROR_STOP=1 --no-psqlrc -U "$POSTGRES_USER" -d "$POSTGRES_DB" -q -f "$f"
  done
  pg_ctl -D "$PGDATA" -m fast -w stop > /dev/null
  echo "docker-entrypoint: PostgreSQL init process complete; ready for start up."
fi

if [ "${1:-}" = postgres ]; then
  shift
  exec postgres -c listen_addresses='*' "$@"
fi
exec "$@"
