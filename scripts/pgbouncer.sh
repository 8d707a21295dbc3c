#!/usr/bin/env bash
# pgbouncer.sh — a private pgbouncer in transaction pool mode, in front of the
# PostgreSQL server the other targets use, for the pgbouncer integration test.
#
#   scripts/pgbouncer.sh url    ensure it runs; print its URL (same database
#                               name as the upstream URL; any other database
#                               name is routed to the same-named database)
#   scripts/pgbouncer.sh stop   stop it
#
# The upstream is DATABASE_URL, or else the private cluster of
# scripts/devdb.sh. When PGBOX_PGBOUNCER_URL is already set, `url` prints it
# and touches nothing. The instance lives in .pgbox/pgbouncer/ (git-ignored;
# PGBOX_PGBOUNCER_STATE overrides it), listens on 127.0.0.1 only, on a port
# derived from the checkout's path, with pool_mode = transaction, and runs as
# a non-root user when invoked as root (pgbouncer refuses root). If pgbouncer
# is missing and we are root, Debian's pgbouncer package is installed first.
# All progress goes to stderr; stdout carries only the URL. Passwords are
# never printed to stderr.
set -euo pipefail

cmd=${1:-url}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
state=${PGBOX_PGBOUNCER_STATE:-$root/.pgbox/pgbouncer}
conf="$state/pgbouncer.ini"
pidfile="$state/pgbouncer.pid"
log="$state/pgbouncer.log"

say() { printf 'pgbouncer.sh: %s\n' "$*" >&2; }
die() { printf 'pgbouncer.sh: error: %s\n' "$*" >&2; exit 1; }

if [[ $cmd == url && -n ${PGBOX_PGBOUNCER_URL:-} ]]; then
  printf '%s\n' "$PGBOX_PGBOUNCER_URL"
  exit 0
fi

running() { [[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

stop() {
  if running; then
    local pid
    pid=$(cat "$pidfile")
    kill -TERM "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    say "stopped"
  else
    say "not running"
  fi
}

case $cmd in
stop) stop; exit 0 ;;
url) ;;
*) die "unknown command '$cmd' (want url or stop)" ;;
esac

bin=$(command -v pgbouncer || true)
[[ -n $bin ]] || bin=$(ls /usr/sbin/pgbouncer 2>/dev/null || true)
if [[ -z $bin ]]; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    say "pgbouncer not found; installing Debian's pgbouncer package"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq pgbouncer >&2
    # The package starts a system-wide instance on port 6432; ours is private.
    if command -v systemctl >/dev/null 2>&1; then systemctl disable --now pgbouncer >/dev/null 2>&1 || true; fi
    bin=/usr/sbin/pgbouncer
  fi
  [[ -x $bin ]] || die "pgbouncer is not installed.
  As root: 'apt-get install pgbouncer' (Debian/Ubuntu), or put pgbouncer on PATH,
  or set PGBOX_PGBOUNCER_URL to a pgbouncer in transaction pool mode in front of DATABASE_URL's server."
fi

upstream=${DATABASE_URL:-}
if [[ -z $upstream ]]; then
  upstream=$("$root/scripts/devdb.sh" url)
fi

# postgres://user[:password]@host[:port]/dbname[?params]
re='^postgres(ql)?://([^:@/]+)(:([^@]*))?@([^:/?]+)(:([0-9]+))?/([^?]+)(\?(.*))?$'
[[ $upstream =~ $re ]] || die "cannot parse the upstream URL (want postgres://user[:password]@host[:port]/dbname); set DATABASE_URL in that form"
user=${BASH_REMATCH[2]}
password=${BASH_REMATCH[4]}
host=${BASH_REMATCH[5]}
port=${BASH_REMATCH[7]:-5432}
dbname=${BASH_REMATCH[8]}
params=${BASH_REMATCH[10]:-}
urldecode() { local s=${1//+/ }; printf '%b' "${s//%/\\x}"; }

# Who runs pgbouncer: ourselves, unless we are root.
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

mkdir -p "$state"
chmod 700 "$state"
exec 9>"$state/lock"
flock 9 # concurrent callers (parallel test packages) start one instance

port_file="$state/port"
if [[ ! -s $port_file ]]; then
  sum=$(printf '%s' "$state" | cksum | cut -d' ' -f1)
  p=$((40000 + sum % 10000))
  while (echo >"/dev/tcp/127.0.0.1/$p") 2>/dev/null; do p=$((p + 1)); done
  echo "$p" >"$port_file"
fi
listen_port=$(cat "$port_file")

auth_type=trust
if [[ -n $password ]]; then auth_type=scram-sha-256; fi
new_conf=$(cat <<CONF
; written by scripts/pgbouncer.sh; rewritten on every run
[databases]
; any database name goes to the same-named database upstream
* = host=$host port=$port

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $listen_port
unix_socket_dir =
pool_mode = transaction
auth_type = $auth_type
auth_file = $state/userlist.txt
max_client_conn = 2000
default_pool_size = 20
max_db_connections = 60
server_idle_timeout = 30
autodb_idle_timeout = 60
ignore_startup_parameters = extra_float_digits
logfile = $log
pidfile = $pidfile
CONF
)
umask 077
printf '"%s" "%s"\n' "$(urldecode "$user")" "$(urldecode "$password")" >"$state/userlist.txt.new"
mv "$state/userlist.txt.new" "$state/userlist.txt"
changed=1
if [[ -f $conf ]] && [[ $(cat "$conf") == "$new_conf" ]]; then changed=0; fi
printf '%s\n' "$new_conf" >"$conf"
[[ ${#run_as[@]} -eq 0 ]] || chown -R "$owner" "$state"
if ! "${run_as[@]}" test -r "$conf"; then
  die "user '$owner' cannot reach $state (a parent directory is not searchable); set PGBOX_PGBOUNCER_STATE to a directory it can reach"
fi

if running && [[ $changed -eq 1 ]]; then
  say "configuration changed; restarting"
  stop
fi
if ! running; then
  say "starting pgbouncer on 127.0.0.1:$listen_port (transaction pooling) in front of $host:$port"
  rm -f "$pidfile"
  "${run_as[@]}" "$bin" -d "$conf" >&2 9>&- || { tail -20 "$log" >&2 || true; die "pgbouncer did not start; see $log"; }
  for _ in $(seq 50); do (echo >"/dev/tcp/127.0.0.1/$listen_port") 2>/dev/null && break; sleep 0.1; done
  (echo >"/dev/tcp/127.0.0.1/$listen_port") 2>/dev/null || { tail -20 "$log" >&2 || true; die "pgbouncer is not listening on $listen_port; see $log"; }
fi

userinfo=$user
[[ -z $password ]] || userinfo="$user:$password"
# The private pgbouncer speaks plain TCP on loopback: sslmode=disable.
query=sslmode=disable
IFS='&' read -r -a kv <<<"$params"
for p in "${kv[@]}"; do [[ -z $p || $p == sslmode=* ]] || query+="&$p"; done
printf 'postgres://%s@127.0.0.1:%s/%s?%s\n' "$userinfo" "$listen_port" "$dbname" "$query"
