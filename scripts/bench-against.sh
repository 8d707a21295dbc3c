#!/usr/bin/env bash
# bench-against.sh <commit> — the relay drain and latency benchmarks of an
# older commit beside today's, in one sitting (issue 26: a 45% drain regression showed only
# when someone compared by hand).
#
# Builds the relay binary of <commit> from this repository's own history (a
# detached `git worktree` in a temporary directory, removed afterwards) and
# the relay binary of the working tree, then runs relay.BenchmarkDrainBinaries:
# both binaries and the hand-written baseline loop (DELETE … RETURNING +
# produce) drain the same backlogs, taking turns, at 1,000 keys, unique keys
# and 10 keys; then relay.BenchmarkLatencyBinaries: both binaries, taking
# turns, serve 8 writers committing 1,000 single-message transactions a
# second for 5 s (outbox Notify), commit to a consumer's receipt, p50 and
# p99. benchtable prints the rates, latencies and ratios. Nothing is
# written into the checkout.
#
#   scripts/bench-against.sh f0acb98             # BENCHTIME=3x by default
#   BENCHTIME=5x scripts/bench-against.sh HEAD~10
#
# Uses DATABASE_URL when set, else the checkout's private cluster
# (scripts/devdb.sh), like `make bench`.
set -euo pipefail

commit=${1:?usage: scripts/bench-against.sh <commit>}
GO=${GO:-go}
root=$(git rev-parse --show-toplevel)
cd "$root"
rev=$(git rev-parse --verify --quiet "$commit^{commit}") || { echo "bench-against: $commit is not a commit of this repository" >&2; exit 2; }
label=$(git rev-parse --short "$rev")

tmp=$(mktemp -d "${TMPDIR:-/tmp}/pgbox-bench-against.XXXXXX")
cleanup() {
	git worktree remove --force "$tmp/src" >/dev/null 2>&1 || true
	rm -rf "$tmp"
}
trap cleanup EXIT

git worktree add --quiet --detach "$tmp/src" "$rev"
# The binary's package moved (cmd/pgbox-relay became cmd/relay).
build() { # dir out
	local pkg
	for pkg in ./cmd/relay ./cmd/pgbox-relay; do
		if [ -d "$1/$pkg" ]; then
			(cd "$1" && "$GO" build -o "$2" "$pkg")
			return
		fi
	done
	echo "bench-against: no relay command (cmd/relay or cmd/pgbox-relay) in $1" >&2
	exit 2
}
echo "bench-against: building the relay of $label and of the working tree" >&2
build "$tmp/src" "$tmp/relay-$label"
build "$root" "$tmp/relay-today"

url=${DATABASE_URL:-$(scripts/devdb.sh url)}
DATABASE_URL="$url" PGBOX_BENCH_RELAYS="today=$tmp/relay-today,$label=$tmp/relay-$label" \
	"$GO" test -run '^$' -bench '^Benchmark(Drain|Latency)Binaries$' -benchtime "${BENCHTIME:-3x}" -timeout 120m ./relay/ |
	"$GO" run ./internal/tools/benchtable
