#!/usr/bin/env bash
# devdb.sh — a private PostgreSQL cluster for this checkout, so that `make test`,
# `make bench` and `make demo` need no setup by hand.
#
#   scripts/devdb.sh url    ensure the cluster runs; print its DATABASE_URL
#   scripts/devdb.sh stop   stop it (data is kept for the next run)
#   scripts/devdb.sh wipe   stop it and delete its data dir
#
# When DATABASE_URL is already set, `url` prints it and touches nothing.
# Otherwise the cluster lives in .pgbox/ (git-ignored) under the checkout, listens
# on 127.0.0.1 only, on a port derived from the checkout's path, and runs as a
# non-root user (postgres, or pgbox created for the purpose) when invoked as root.
# If no server binaries are found and we are root, Debian's postgresql package is
# installed first. All progress goes to stderr; stdout carries only the URL.
#
# Two settings serve `make test-matrix` (scripts/pgmatrix.sh), which runs one
# cluster per PostgreSQL major version:
#   PGBOX_PG_BINDIR     the directory holding initdb, pg_ctl and postgres
#                       (instead of searching pg_config, /usr/lib/postgresql
#                       and PATH); psql is taken from there or found as usual
#   PGBOX_DEVDB_STATE   the state directory (instead of .pgbox/)
set -euo pipefail

cmd=${1:-url}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
state=${PGBOX_DEVDB_STATE:-$root/.pgbox}
data="$state/pgdata"
log="$state/postgres.log"

say() { printf 'devdb: %s\n' "$*" >&2; }
die() { printf 'devdb: error: %s\n' "$*" >&2; exit 1; }

if [[ $cmd == url && -n ${DATABASE_URL:-} ]]; then
  printf '%s\n' "$DATABASE_URL"
  exit 0
fi

find_bindir() {
  local d
  if [[ -n ${PGBOX_PG_BINDIR:-} ]]; then
    [[ -x $PGBOX_PG_BINDIR/initdb && -x $PGBOX_PG_BINDIR/pg_ctl ]] || die "PGBOX_PG_BINDIR=$PGBOX_PG_BINDIR holds no initdb and pg_ctl"
    echo "$PGBOX_PG_BINDIR"; return 0
  fi
  if command -v pg_config >/dev/null 2>&1; then
    d=$(pg_config --bindir 2>/dev/null || true)
    if [[ -x $d/initdb && -x $d/pg_ctl ]]; then echo "$d"; return 0; fi
  fi
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k4 -V -r); do
    if [[ -x $d/initdb && -x $d/pg_ctl ]]; then echo "$d"; return 0; fi
  done
  if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
    dirname "$(readlink -f "$(command -v initdb)")"; return 0
  fi
  return 1
}

bindir=$(find_bindir || true)
if [[ -z $bindir && $cmd == url ]]; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    say "no PostgreSQL server binaries found; installing Debian's postgresql package"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq postgresql >&2
    bindir=$(find_bindir || true)
  fi
  [[ -n $bindir ]] || die "no PostgreSQL server binaries (initdb, pg_ctl) found.
  Either set DATABASE_URL to a PostgreSQL 14+ database you may create schemas in,
  or install the server: as root, 'apt-get install postgresql' (Debian/Ubuntu);
  or put a directory holding initdb and pg_ctl on PATH."
fi

# Who runs the server: ourselves, unless we are root (postgres refuses root).
run_as=()
owner=$(id -un)
if [[ $(id -u) -eq 0 ]]; then
  if id postgres >/dev/null 2>&1; then owner=postgres
  else
    id pgbox >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin pgbox
    owner=pgbox
  fi
  run_as=(runuser -u "$owner" --)
fi
as_owner() { "${run_as[@]}" "$@"; }

# A port of our own, stable for this checkout.
port_file="$state/port"
pick_port() {
  local sum p
  sum=$(printf '%s' "${PGBOX_DEVDB_STATE:-$root}" | cksum | cut -d' ' -f1)
  p=$((20000 + sum % 20000))
  while (echo >"/dev/tcp/127.0.0.1/$p") 2>/dev/null; do p=$((p + 1)); done
  echo "$p"
}

pg_ctl_() { as_owner "$bindir/pg_ctl" -D "$data" "$@"; }
running() { [[ -f $data/postmaster.pid ]] && pg_ctl_ status >/dev/null 2>&1; }

case $cmd in
stop)
  if [[ -n $bindir && -d $data ]] && running; then pg_ctl_ stop -m fast -w >&2; say "stopped"; else say "not running"; fi
  exit 0 ;;
wipe)
  if [[ -n $bindir && -d $data ]] && running; then pg_ctl_ stop -m immediate -w >&2 || true; fi
  rm -rf "$state"; say "wiped $state"; exit 0 ;;
url) ;;
*) die "unknown command '$cmd' (want url, stop or wipe)" ;;
esac

mkdir -p "$state"
if [[ ! -s $data/PG_VERSION ]]; then
  rm -rf "$data"
  mkdir -p "$data"
  chmod 700 "$data"
  [[ ${#run_as[@]} -eq 0 ]] || chown -R "$owner" "$state"
  # The server user must be able to reach its data dir through the checkout.
  if ! as_owner test -x "$state"; then
    die "user '$owner' cannot reach $state (a parent directory is not searchable).
  Set DATABASE_URL to an existing database instead, or move the checkout."
  fi
  say "initdb into $data (as $owner)"
  as_owner "$bindir/initdb" -D "$data" -U pgbox -A trust -E UTF8 --locale=C.UTF-8 >"$state/initdb.log" 2>&1 \
    || as_owner "$bindir/initdb" -D "$data" -U pgbox -A trust -E UTF8 --no-locale >"$state/initdb.log" 2>&1 \
    || die "initdb failed; see $state/initdb.log"
  pick_port >"$port_file"
  cat >>"$data/postgresql.conf" <<CONF
# devdb.sh
listen_addresses = '127.0.0.1'
port = $(cat "$port_file")
unix_socket_directories = ''
max_connections = 400
shared_buffers = 256MB
max_wal_size = 2GB
log_min_messages = warning
CONF
fi
port=$(cat "$port_file")

if ! running; then
  [[ ${#run_as[@]} -eq 0 ]] || chown -R "$owner" "$state"
  say "starting PostgreSQL on 127.0.0.1:$port"
  if ! pg_ctl_ start -w -t 60 -l "$log" >/dev/null 2>&1; then
    tail -20 "$log" >&2 || true
    die "PostgreSQL did not start; see $log"
  fi
fi

psql=$bindir/psql
if [[ ! -x $psql ]]; then # server-only bindirs (PGBOX_PG_BINDIR) have no psql
  psql=$(command -v psql || ls -d /usr/lib/postgresql/*/bin/psql 2>/dev/null | sort -V | tail -1 || true)
  [[ -n $psql ]] || die "no psql found next to $bindir/initdb or on PATH"
fi
psql_() { "$psql" -X -q -h 127.0.0.1 -p "$port" -U pgbox "$@"; }
if ! psql_ -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'pgbox'" | grep -q 1; then
  psql_ -d postgres -c "CREATE DATABASE pgbox" >&2
fi
printf 'postgres://pgbox@127.0.0.1:%s/pgbox?sslmode=disable\n' "$port"
