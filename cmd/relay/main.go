// Command relay is pgbox's one binary: it drains the outbox to Kafka, prunes
// the inbox and outbox on a schedule, migrates the schema, reports backlog,
// and prints status. The orders→payments demo is examples/demo (`make demo`).
//
//	relay run                 relay + cleanup on a schedule, /metrics, /healthz, /readyz
//	relay migrate up|down|status
//	relay cleanup [--dry-run] one cleanup pass, for an external cron
//	relay status [NAME] [--json]  backlog, lanes, parked rows, inbox ages
//	relay parked list|retry|discard [ID...]   parked outbox rows (discard needs --yes)
//	relay dead list|replay [ID...]            the consumer adapter's dead letters
//	relay targets list|watch                  the target list (--targets, --targets-query)
//	relay version
//
// Settings come from flags or environment variables (DATABASE_URL,
// KAFKA_BROKERS, PGBOX_…); `relay <command> --help` lists them with their
// defaults. Exit codes: 0 success, 1 failure, 2 bad flags, environment or
// arguments.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// SIGHUP never stops the process (Go's default would): a command that
	// follows a target list re-reads it (watchTargets); the others ignore it.
	signal.Notify(hups, syscall.SIGHUP)
	code := realMain(ctx, os.Args[1:], os.Stdout, os.Stderr, os.LookupEnv)
	stop()
	os.Exit(code)
}

// command is one subcommand: the option groups it reads and what it runs.
type command struct {
	name     string
	synopsis string
	// summary is the one sentence `relay --help` shows beside the synopsis.
	summary string
	doc     string
	groups  []string
	run     func(ctx context.Context, a *app, args []string) error
}

var commands []*command

func init() {
	commands = []*command{
		{name: "run", synopsis: "run", summary: "Publish the outbox to Kafka and prune old rows on a schedule.",
			doc:    runDoc,
			groups: []string{groupDB, groupTargets, groupTargetsWatch, groupTargetsEach, groupKafka, groupRelay, groupCleanup, groupHTTP, groupConsole, groupLog}, run: cmdRun},
		{name: "migrate", synopsis: "migrate up|down|status", summary: "Apply, roll back (one version per run) or list pgbox's migrations.",
			doc:    migrateDoc,
			groups: []string{groupDB, groupTargets, groupMigrate, groupLog}, run: cmdMigrate},
		{name: "cleanup", synopsis: "cleanup [--dry-run]", summary: "Run one cleanup pass and print its report.",
			doc:    cleanupDoc,
			groups: []string{groupDB, groupTargets, groupTargetsEach, groupKafka, groupCleanup, groupCleanupOnce, groupLog}, run: cmdCleanup},
		{name: "status", synopsis: "status [NAME] [--json]", summary: "Print the outbox backlog, parked rows, lane owners and inbox key ages.",
			doc:    statusDoc,
			groups: []string{groupDB, groupTargets, groupTargetsEach, groupKafkaOptional, groupCleanup, groupStatus, groupLog}, run: cmdStatus},
		{name: "parked", synopsis: "parked list|retry|discard [ID...]", summary: "List, retry or discard parked outbox rows.",
			doc:    parkedDoc,
			groups: []string{groupDB, groupOps, groupOpsParked, groupLog}, run: cmdParked},
		{name: "dead", synopsis: "dead list|replay [ID...]", summary: "List or replay the consumer adapter's dead letters.",
			doc:    deadDoc,
			groups: []string{groupDB, groupOps, groupOpsDead, groupLog}, run: cmdDead},
		{name: "targets", synopsis: "targets list|watch", summary: "Print the target list (--targets, --targets-query), once or as it changes.",
			doc:    targetsDoc,
			groups: []string{groupDB, groupTargets, groupTargetsWatch, groupLog}, run: cmdTargets},
		{name: "version", synopsis: "version", summary: "Print the version of this binary and of the schema it ships.",
			doc:    "Print the version of this binary and of the schema it ships.",
			groups: nil, run: cmdVersion},
	}
}

func findCommand(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// app is what a subcommand runs with.
type app struct {
	opts   *options
	set    *settings
	stdout io.Writer
	stderr io.Writer
	log    *logger
}

// realMain runs one command and returns the exit status. Every error is
// printed once: a usage error as one line (status 2), a runtime failure as one
// line, or as one JSON log record with --log-format=json (status 1).
func realMain(ctx context.Context, args []string, stdout, stderr io.Writer, lookupEnv func(string) (string, bool)) int {
	if len(args) == 0 {
		topUsage(stderr)
		return 2
	}
	name := args[0]
	switch name {
	case "-h", "-help", "--help", "help":
		topUsage(stdout)
		return 0
	case "-v", "--version":
		name = "version"
	}
	c := findCommand(name)
	if c == nil {
		fmt.Fprintf(stderr, "relay: unknown command %q (allowed: run, migrate, cleanup, status, parked, dead, targets, version; see `relay --help`)\n", name)
		return 2
	}
	opts := &options{}
	set := newSettings()
	opts.bind(set, c.groups...)
	pos, err := set.parse(c.name, args[1:], lookupEnv, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err == nil {
		err = opts.validate(c.name)
	}
	if err != nil {
		fmt.Fprintf(stderr, "relay: %v\n", trimUsage(err))
		return 2
	}
	a := &app{opts: opts, set: set, stdout: stdout, stderr: stderr}
	a.log = newLogger(stderr, opts.LogFormat, opts.LogLevel)
	a.logSettings(slog.LevelDebug, "relay "+c.name+" settings")
	if err := c.run(ctx, a, pos); err != nil {
		if errors.Is(err, errUsage) {
			fmt.Fprintf(stderr, "relay: %v\n", trimUsage(err))
			return 2
		}
		if errors.Is(err, context.Canceled) && ctx.Err() != nil {
			fmt.Fprintf(stderr, "relay %s: interrupted\n", c.name)
			return 1
		}
		if opts.LogFormat == "json" {
			a.log.Error("relay "+c.name+" failed", "err", err)
		} else {
			// One line: pgx puts each address it tried on a line of its own.
			fmt.Fprintf(stderr, "relay %s: %s\n", c.name, strings.Join(strings.Fields(err.Error()), " "))
		}
		return 1
	}
	return 0
}

// trimUsage drops the "usage error: " prefix from messages.
func trimUsage(err error) string { return strings.TrimPrefix(err.Error(), errUsage.Error()+": ") }

func topUsage(out io.Writer) {
	fmt.Fprint(out, `relay — pgbox's operator binary: outbox relay, cleanup, migrations, status.

Usage: relay <command> [flags]

Commands:
`)
	for _, c := range commands {
		fmt.Fprintf(out, "  %-34s %s\n", c.synopsis, c.summary)
	}
	fmt.Fprint(out, `
Every setting is a flag and an environment variable (the flag wins).
Exit codes: 0 success, 1 failure, 2 bad flags, environment or arguments.
`)
	// List every setting once, grouped, so one --help shows them all.
	opts := &options{}
	set := newSettings()
	opts.bind(set, allGroups...)
	printSettings(out, set.list)
	fmt.Fprintln(out, "\n`relay <command> --help` shows the settings one command reads.")
}
