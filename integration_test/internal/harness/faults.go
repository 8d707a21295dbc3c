package harness

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
)

// Fault is one kind of failure the driver injects.
type Fault string

// The fault kinds, each injected several times per run.
const (
	KillRelay     Fault = "kill -9 relay"
	KillConsumer  Fault = "kill -9 consumer"
	BrokerRestart Fault = "broker kill -9 + restart"
	BrokerPause   Fault = "broker stopped (SIGSTOP)"
	PGRestart     Fault = "postgres restart -m immediate"
	PGTerminate   Fault = "pg_terminate_backend"
	CleanupRewind Fault = "cleanup + rewind to earliest"
)

// AllFaults lists every kind, in report order.
var AllFaults = []Fault{KillRelay, KillConsumer, BrokerRestart, BrokerPause, PGRestart, PGTerminate, CleanupRewind}

// injector carries what a fault needs.
type injector struct {
	w   *World
	rng *rand.Rand
	// violations found while injecting (a broker restart that lost records).
	violations []string
	// inboxDeleted counts inbox keys removed by the cleanup faults.
	inboxDeleted int64
	redelivered  int64
}

// inject runs one fault and returns what it did.
func (in *injector) inject(ctx context.Context, f Fault) (string, error) {
	switch f {
	case KillRelay:
		return in.killRestart(in.w.Relays)
	case KillConsumer:
		return in.killRestart(in.w.Consumers)
	case BrokerRestart:
		return in.brokerRestart(ctx)
	case BrokerPause:
		d := time.Duration(3000+in.rng.IntN(3000)) * time.Millisecond
		if err := in.w.Broker.Pause(); err != nil {
			return "", err
		}
		time.Sleep(d)
		return fmt.Sprintf("broker unresponsive for %v", d.Round(time.Millisecond)), in.w.Broker.Resume()
	case PGRestart:
		start := time.Now()
		if err := in.w.PG.RestartImmediate(ctx); err != nil {
			return "", err
		}
		return fmt.Sprintf("crash + recovery took %v", time.Since(start).Round(time.Millisecond)), nil
	case PGTerminate:
		return in.terminateBackends(ctx)
	case CleanupRewind:
		return in.cleanupRewind(ctx)
	}
	return "", fmt.Errorf("unknown fault %q", f)
}

func (in *injector) killRestart(ps []*Proc) (string, error) {
	p := ps[in.rng.IntN(len(ps))]
	pid := p.Pid()
	if err := p.Kill(); err != nil {
		return "", err
	}
	down := time.Duration(in.rng.IntN(2000)) * time.Millisecond
	time.Sleep(down)
	return fmt.Sprintf("%s (pid %d) killed, restarted after %v", p.Name, pid, down), p.Start()
}

func (in *injector) brokerRestart(ctx context.Context) (string, error) {
	topics := []string{OrdersTopic, PaymentsTopic}
	before, err := highWaterMarks(in.w.Brokers, topics)
	if err != nil {
		return "", fmt.Errorf("high-water marks before the broker kill: %w", err)
	}
	if err := in.w.Broker.Kill(); err != nil {
		return "", err
	}
	down := time.Duration(500+in.rng.IntN(2500)) * time.Millisecond
	time.Sleep(down)
	if err := in.w.StartBroker(ctx); err != nil {
		return "", err
	}
	after, err := highWaterMarks(in.w.Brokers, topics)
	if err != nil {
		return "", fmt.Errorf("high-water marks after the broker restart: %w", err)
	}
	var total int64
	for tp, hwm := range before {
		total += hwm
		if after[tp] < hwm {
			in.violations = append(in.violations, fmt.Sprintf("BROKER RESTART LOST RECORDS: %s high-water mark %d before kill -9, %d after restart", tp, hwm, after[tp]))
		}
	}
	return fmt.Sprintf("down %v; %d committed records checked present after restart", down.Round(time.Millisecond), total), nil
}

// highWaterMarks maps "topic/partition" to its high-water mark.
func highWaterMarks(brokers []string, topics []string) (map[string]int64, error) {
	client, err := sarama.NewClient(brokers, KafkaConfig())
	if err != nil {
		return nil, err
	}
	defer client.Close()
	out := map[string]int64{}
	for _, t := range topics {
		parts, err := client.Partitions(t)
		if err != nil {
			return nil, fmt.Errorf("partitions of %s: %w", t, err)
		}
		for _, p := range parts {
			hwm, err := client.GetOffset(t, p, sarama.OffsetNewest)
			if err != nil {
				return nil, fmt.Errorf("high-water mark of %s/%d: %w", t, p, err)
			}
			out[fmt.Sprintf("%s/%d", t, p)] = hwm
		}
	}
	return out, nil
}

const backendsSQL = `SELECT pid, application_name FROM pg_stat_activity
WHERE datname IN ('orders', 'payments') AND backend_type = 'client backend' AND pid <> pg_backend_pid() AND application_name <> ''
ORDER BY pid`

func (in *injector) terminateBackends(ctx context.Context) (string, error) {
	conn, err := pgx.Connect(ctx, in.w.PG.URL("postgres"))
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	type backend struct {
		Pid int32
		App string
	}
	rows, _ := conn.Query(ctx, backendsSQL)
	bs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[backend])
	if err != nil {
		return "", fmt.Errorf("list backends: %w", err)
	}
	if len(bs) == 0 {
		return "no pgbox connections to terminate", nil
	}
	in.rng.Shuffle(len(bs), func(i, j int) { bs[i], bs[j] = bs[j], bs[i] })
	k := 1 + in.rng.IntN(max(1, len(bs)/2))
	var names []string
	for _, b := range bs[:k] {
		if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend($1)`, b.Pid); err != nil {
			return "", fmt.Errorf("terminate backend %d (%s): %w", b.Pid, b.App, err)
		}
		names = append(names, b.App)
	}
	return fmt.Sprintf("terminated %d of %d connections: %s", k, len(bs), strings.Join(names, ",")), nil
}

// CleanupBufferDefault is Options.CleanupBuffer's default: the cleanup
// pass's buffer beyond retention.ms + segment.ms. Not 0s: the binary reads
// an explicit 0s as "use the 24h default" (a zero-value defect being
// fixed), which would make the pass delete nothing and the rewind prove
// nothing.
const CleanupBufferDefault = time.Second

// cleanupRewind: stop the payments group once it has consumed everything
// retention is about to delete; let the broker apply the orders topic's
// short retention; run `relay cleanup` (buffer 0) on the payments
// database; delete the group, so its members restart from the earliest
// offset still in Kafka. Every redelivered record's inbox key must still be
// there.
func (in *injector) cleanupRewind(ctx context.Context) (string, error) {
	if err := in.stopGroupCaughtUp(ctx); err != nil {
		return "", err
	}
	if err := in.w.ApplyRetention(); err != nil {
		return "", err
	}
	keysBefore, err := in.w.InboxKeys(ctx)
	if err != nil {
		return "", err
	}
	if _, err := in.w.Cleanup(ctx); err != nil {
		return "", err
	}
	keysAfter, err := in.w.InboxKeys(ctx)
	if err != nil {
		return "", err
	}
	in.inboxDeleted += keysBefore - keysAfter
	earliest, err := earliestOffsets(in.w.Brokers, OrdersTopic)
	if err != nil {
		return "", err
	}
	hwms, err := highWaterMarks(in.w.Brokers, []string{OrdersTopic})
	if err != nil {
		return "", err
	}
	var redeliver int64
	for tp, hwm := range hwms {
		redeliver += hwm - earliest[tp]
	}
	in.redelivered += redeliver
	if err := in.w.restartGroupAtEarliest(ctx); err != nil {
		return "", err
	}
	return fmt.Sprintf("inbox keys %d → %d; group rewound to %v (%d records redelivered)", keysBefore, keysAfter, sortedOffsets(earliest), redeliver), nil
}

// stopGroupCaughtUp stops the consumers (SIGTERM: they commit and leave)
// once their committed offsets cover every record older than the retention
// (with a margin): retention must delete only what was consumed, or the
// verifier would count Kafka's own deletions as lost events.
func (in *injector) stopGroupCaughtUp(ctx context.Context) error {
	deadline := time.Now().Add(3 * time.Minute)
	for {
		// While they run: wait for the group to cover the retention edge
		// a few seconds ahead, then stop it and check again.
		ok, err := groupCovers(in.w.Brokers, time.Now().Add(-in.w.Opts.Retention+5*time.Second))
		if err == nil && ok {
			for _, p := range in.w.Consumers {
				if err := p.Term(15 * time.Second); err != nil {
					return err
				}
			}
			ok, err = groupCovers(in.w.Brokers, time.Now().Add(-in.w.Opts.Retention+2*time.Second))
			if err != nil || ok {
				return err
			}
			for _, p := range in.w.Consumers {
				if err := p.Start(); err != nil {
					return err
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the payments group lagged more than the orders topic's retention (%v) for 3 minutes (last error: %v)", in.w.Opts.Retention, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// groupCovers reports whether the group's committed offsets are at or past
// the first record of each partition stamped at or after t.
func groupCovers(brokers []string, t time.Time) (bool, error) {
	client, err := sarama.NewClient(brokers, KafkaConfig())
	if err != nil {
		return false, err
	}
	defer client.Close()
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return false, err
	}
	// The admin owns the client now: closing it closes both.
	defer admin.Close()
	res, err := admin.ListConsumerGroupOffsets(Group, nil)
	if err != nil {
		return false, fmt.Errorf("offsets of group %s: %w", Group, err)
	}
	parts, err := client.Partitions(OrdersTopic)
	if err != nil {
		return false, err
	}
	for _, p := range parts {
		need, err := client.GetOffset(OrdersTopic, p, t.UnixMilli())
		if err != nil {
			return false, err
		}
		if need < 0 { // no record that recent: everything must be consumed
			if need, err = client.GetOffset(OrdersTopic, p, sarama.OffsetNewest); err != nil {
				return false, err
			}
		}
		b := res.GetBlock(OrdersTopic, p)
		if b == nil || b.Offset < need {
			return false, nil
		}
	}
	return true, nil
}

func earliestOffsets(brokers []string, topic string) (map[string]int64, error) {
	client, err := sarama.NewClient(brokers, KafkaConfig())
	if err != nil {
		return nil, err
	}
	defer client.Close()
	parts, err := client.Partitions(topic)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, p := range parts {
		o, err := client.GetOffset(topic, p, sarama.OffsetOldest)
		if err != nil {
			return nil, err
		}
		out[fmt.Sprintf("%s/%d", topic, p)] = o
	}
	return out, nil
}

// ApplyRetention makes the broker delete what its topics' retention.ms
// allows (Kafka's periodic retention check, run when the driver says).
func (w *World) ApplyRetention() error {
	if err := w.Broker.Signal(syscall.SIGUSR1); err != nil {
		return err
	}
	time.Sleep(500 * time.Millisecond) // the broker applies it on its own loop
	return nil
}

// Cleanup runs one `relay cleanup` pass on the payments database
// (buffer 1s), logs its output to cleanup.log and returns it.
func (w *World) Cleanup(ctx context.Context) (string, error) {
	out, err := w.RunRelay(ctx, "cleanup", "--database-url", w.dsn(PaymentsDB, "cleanup"), "--kafka-brokers", w.Brokers[0], "--cleanup-buffer", w.Opts.CleanupBuffer.String())
	appendFile(filepath.Join(w.Dir, "cleanup.log"), out)
	if err != nil {
		return out, fmt.Errorf("relay cleanup: %w\n%s", err, out)
	}
	return out, nil
}

// WaitConsumed waits until the payments group's committed offsets reach the
// high-water mark of every partition of every orders topic.
func (w *World) WaitConsumed(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := w.groupAtEnd()
		if err == nil && ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("group %s has not consumed every orders topic to its end within %v (last error: %v)", Group, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (w *World) groupAtEnd() (bool, error) {
	admin, err := sarama.NewClusterAdmin(w.Brokers, KafkaConfig())
	if err != nil {
		return false, err
	}
	defer admin.Close()
	res, err := admin.ListConsumerGroupOffsets(Group, nil)
	if err != nil {
		return false, err
	}
	hwms, err := highWaterMarks(w.Brokers, w.Opts.OrderTopics)
	if err != nil {
		return false, err
	}
	earliest := map[string]int64{}
	for _, t := range w.Opts.OrderTopics {
		e, err := earliestOffsets(w.Brokers, t)
		if err != nil {
			return false, err
		}
		maps.Copy(earliest, e)
	}
	for tp, hwm := range hwms {
		if earliest[tp] >= hwm {
			continue // nothing left in Kafka to consume (a group never commits there)
		}
		var topic string
		var p int32
		if i := strings.LastIndexByte(tp, '/'); i > 0 {
			topic = tp[:i]
			fmt.Sscan(tp[i+1:], &p)
		}
		b := res.GetBlock(topic, p)
		if b == nil || b.Offset < hwm {
			return false, nil
		}
	}
	return true, nil
}

// Rewind stops the payments group, deletes it (its committed offsets) and
// starts it again: its members begin at the earliest offset still in Kafka,
// as `kafka-consumer-groups --reset-offsets --to-earliest` would.
func (w *World) Rewind(ctx context.Context) error {
	for _, p := range w.Consumers {
		if err := p.Term(15 * time.Second); err != nil {
			return err
		}
	}
	return w.restartGroupAtEarliest(ctx)
}

// restartGroupAtEarliest deletes the stopped payments group, retrying while
// the broker still counts a leaving member, and starts its members.
func (w *World) restartGroupAtEarliest(ctx context.Context) error {
	if err := w.deleteGroup(ctx); err != nil {
		return err
	}
	for _, p := range w.Consumers {
		if err := p.Start(); err != nil {
			return err
		}
	}
	return nil
}

func (w *World) deleteGroup(ctx context.Context) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := func() error {
			admin, err := sarama.NewClusterAdmin(w.Brokers, KafkaConfig())
			if err != nil {
				return err
			}
			defer admin.Close()
			return admin.DeleteConsumerGroup(Group)
		}()
		if err == nil || errors.Is(err, sarama.ErrGroupIDNotFound) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("delete consumer group %s: %w", Group, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// InboxKeys counts the payments service's inbox keys.
func (w *World) InboxKeys(ctx context.Context) (int64, error) {
	return w.countPayments(ctx, `SELECT count(*) FROM pgbox_inbox`)
}

// WatermarkRows counts the payments service's offset-watermark rows (one
// per partition it consumed in watermark mode).
func (w *World) WatermarkRows(ctx context.Context) (int64, error) {
	return w.countPayments(ctx, `SELECT count(*) FROM pgbox_inbox_watermark WHERE consumer = 'payments-svc'`)
}

// countPayments runs a count query on the payments database.
func (w *World) countPayments(ctx context.Context, query string) (int64, error) {
	conn, err := pgx.Connect(ctx, w.PG.URL(PaymentsDB))
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	var n int64
	err = conn.QueryRow(ctx, query).Scan(&n)
	return n, err
}

func appendFile(path, s string) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "=== %s\n%s\n", time.Now().Format(time.RFC3339Nano), s)
}
