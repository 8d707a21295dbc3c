package relay

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgbox/pgbox/outbox"
)

var (
	// ErrLaneCountMismatch is returned by Run when live relay instances use a
	// different Config.Lanes than this one.
	ErrLaneCountMismatch = errors.New("relay: lane count differs from the running instances'")
	// ErrRunning is returned by Run when the Relay is already running.
	ErrRunning = errors.New("relay: Run called while already running")
)

// Relay publishes committed outbox rows to Kafka. Make one with New and call
// Run; several instances (processes) may run against one database.
type Relay struct {
	cfg     Config
	id      string // Config.Instance + "#" + random: the owner name in the lease tables
	log     *slog.Logger
	running atomic.Bool
	wake    chan struct{}
	fin     *finishJob // background delete; owned by the worker goroutine
	pre     *claimJob  // prefetched next batch; owned by the worker goroutine

	published, retried, parked, batches atomic.Uint64
	latLast, latMax, latTotal           atomic.Int64
	backlog                             atomic.Int64
	lanes, instances                    atomic.Int64
}

// Stats are the relay's counters since New. A metrics exporter reads them.
type Stats struct {
	// Published counts records Kafka acknowledged (their rows are then deleted).
	Published uint64
	// Retried counts row sends that failed and were left for a later pass
	// (broker outages and permanent failures below MaxAttempts).
	Retried uint64
	// Parked counts rows parked after MaxAttempts permanent failures.
	Parked uint64
	// Batches counts non-empty passes (claim, send, delete).
	Batches uint64
	// BatchLatency* describe non-empty passes, claim to delete.
	BatchLatencyLast, BatchLatencyMax, BatchLatencyTotal time.Duration
	// Backlog is the number of unpublished, unparked rows in the whole outbox
	// at the last heartbeat, counted up to 100,000 so the count stays cheap.
	Backlog int64
	// Lanes is how many lanes this instance held at its last heartbeat.
	Lanes int
	// Instances is how many live relay instances the last heartbeat saw.
	Instances int
}

// New validates cfg, fills in defaults and returns a Relay. It does no I/O.
func New(cfg Config) (*Relay, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	k := *cfg.Kafka // shallow copy: the caller's config stays untouched
	k.Producer.Partitioner = cfg.Partitioner
	cfg.Kafka = &k
	// The lease tables know this Relay by its name plus a random suffix, so two
	// processes configured with the same name (a copy-pasted setting, a pod
	// restarted before its old lease expired) are still two instances and
	// never share a lane.
	b := make([]byte, 4)
	_, _ = crand.Read(b)
	id := cfg.Instance + "#" + hex.EncodeToString(b)
	return &Relay{cfg: cfg, id: id, log: cfg.Logger.With("instance", id), wake: make(chan struct{}, 1)}, nil
}

// Instance returns the name this relay registers under in the lease tables:
// Config.Instance plus "#" and a random suffix unique to this Relay.
func (r *Relay) Instance() string { return r.id }

// Stats returns a snapshot of the counters.
func (r *Relay) Stats() Stats {
	return Stats{
		Published:         r.published.Load(),
		Retried:           r.retried.Load(),
		Parked:            r.parked.Load(),
		Batches:           r.batches.Load(),
		BatchLatencyLast:  time.Duration(r.latLast.Load()),
		BatchLatencyMax:   time.Duration(r.latMax.Load()),
		BatchLatencyTotal: time.Duration(r.latTotal.Load()),
		Backlog:           r.backlog.Load(),
		Lanes:             int(r.lanes.Load()),
		Instances:         int(r.instances.Load()),
	}
}

// Run publishes until ctx is canceled, then finishes or releases the
// in-flight batch (waiting at most StopTimeout for a send), gives up its
// lanes and returns nil. It returns an error only when it cannot start:
// ErrLaneCountMismatch, ErrRunning, or missing pgbox tables. Database and broker failures are
// logged and retried with backoff, never returned.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer r.running.Store(false)

	if err := retry(ctx, r, "prepare lanes", r.ensureLanes); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	var producer sarama.SyncProducer
	err := retry(ctx, r, "connect to Kafka", func(ctx context.Context) error {
		p, err := sarama.NewSyncProducer(r.cfg.Brokers, r.cfg.Kafka)
		producer = p
		return err
	})
	if err != nil { // only ctx ends the retries
		return nil
	}
	r.log.InfoContext(ctx, "relay started", "lanes", r.cfg.Lanes, "brokers", r.cfg.Brokers)

	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { r.heartbeatLoop(runCtx) })
	if !r.cfg.NoListen {
		wg.Go(func() { r.listenLoop(runCtx) })
	}
	sendDone := r.workLoop(runCtx, producer)
	cancel()
	wg.Wait()

	stopCtx, stopCancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.StopTimeout)
	defer stopCancel()
	if _, err := r.cfg.Pool.Exec(stopCtx, releaseSQL, r.id); err != nil {
		r.log.WarnContext(stopCtx, "release lanes", "error", err)
	}
	r.lanes.Store(0)
	// Close the producer once no send uses it (a send abandoned at stop
	// finishes in the background).
	go func() {
		<-sendDone
		if err := producer.Close(); err != nil {
			r.log.Warn("close producer", "error", err)
		}
	}()
	r.log.InfoContext(stopCtx, "relay stopped")
	return nil
}

// retry runs fn until it succeeds, returns ErrLaneCountMismatch, or ctx ends.
func retry(ctx context.Context, r *Relay, what string, fn func(context.Context) error) error {
	var b backoff
	for {
		err := fn(ctx)
		if err == nil || errors.Is(err, ErrLaneCountMismatch) {
			return err
		}
		if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "42P01" {
			return fmt.Errorf("relay: %s: %w (apply pgbox's migrations first: migrations.Up, or `pgbox-relay migrate`)", what, err)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		d := b.next(r.cfg.MaxBackoff)
		r.log.WarnContext(ctx, what+" failed, retrying", "error", err, "backoff", d)
		if !sleep(ctx, d) {
			return ctx.Err()
		}
	}
}

// ensureLanes makes pgbox_relay_lanes hold exactly Lanes rows, reshaping it
// only when no other live instance holds a lane.
func (r *Relay) ensureLanes(ctx context.Context) error {
	return pgx.BeginFunc(ctx, r.cfg.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, lockLanesSQL); err != nil {
			return err
		}
		var count, minLanes, maxLanes, liveOthers int
		if err := tx.QueryRow(ctx, lanesStateSQL, r.id).Scan(&count, &minLanes, &maxLanes, &liveOthers); err != nil {
			return err
		}
		if count == r.cfg.Lanes && minLanes == r.cfg.Lanes && maxLanes == r.cfg.Lanes {
			return nil
		}
		if count > 0 && liveOthers > 0 {
			return fmt.Errorf("%w: live instances use %d lanes, Config.Lanes is %d: give every instance the same Lanes, or stop the others first",
				ErrLaneCountMismatch, maxLanes, r.cfg.Lanes)
		}
		if _, err := tx.Exec(ctx, resetLanesSQL); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, createLanesSQL, r.cfg.Lanes); err != nil {
			return err
		}
		if count > 0 {
			r.log.InfoContext(ctx, "lane count changed", "from", maxLanes, "to", r.cfg.Lanes)
		}
		return nil
	})
}

func (r *Relay) heartbeatLoop(ctx context.Context) {
	t := time.NewTicker(r.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		r.heartbeat(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (r *Relay) heartbeat(ctx context.Context) {
	// A heartbeat slower than the lease is worthless; don't let one hang.
	hctx, cancel := context.WithTimeout(ctx, r.cfg.LeaseTTL/2)
	defer cancel()
	var held, live int
	var backlog int64
	err := r.cfg.Pool.QueryRow(hctx, heartbeatSQL, r.id, r.cfg.LeaseTTL, r.cfg.Lanes, backlogCap, r.cfg.HeartbeatInterval).Scan(&held, &live, &backlog)
	if err != nil {
		if ctx.Err() == nil {
			r.log.WarnContext(ctx, "heartbeat failed", "error", err)
		}
		return
	}
	if prev := r.lanes.Swap(int64(held)); prev != int64(held) {
		r.log.InfoContext(ctx, "lanes changed", "lanes_held", held, "instances", live)
		if int64(held) > prev {
			r.wakeUp()
		}
	}
	r.instances.Store(int64(live))
	r.backlog.Store(backlog)
}

func (r *Relay) wakeUp() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// listenLoop holds a dedicated connection LISTENing on Channel and turns
// any number of notifications into at most one pending wake-up.
func (r *Relay) listenLoop(ctx context.Context) {
	var b backoff
	for ctx.Err() == nil {
		err := r.listen(ctx)
		if ctx.Err() != nil {
			return
		}
		d := b.next(r.cfg.MaxBackoff)
		r.log.WarnContext(ctx, "listen failed, polling meanwhile", "error", err, "backoff", d)
		sleep(ctx, d)
	}
}

func (r *Relay) listen(ctx context.Context) error {
	conn, err := pgx.ConnectConfig(ctx, r.cfg.Pool.Config().ConnConfig.Copy())
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{r.cfg.Channel}.Sanitize()); err != nil {
		return err
	}
	r.wakeUp() // notifications sent while we were not listening are lost
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		r.wakeUp()
	}
}

// workLoop runs passes until ctx ends. It returns a channel closed when no
// send is in flight any more.
func (r *Relay) workLoop(ctx context.Context, p sarama.SyncProducer) <-chan struct{} {
	var (
		b         backoff
		busyUntil time.Time
		nextSlot  int
		idle      = make(chan struct{})
	)
	close(idle)
	defer r.waitFinish()
	defer r.dropPrefetch()
	for {
		if ctx.Err() != nil {
			return idle
		}
		res := r.pass(ctx, p, &nextSlot)
		if res.abandoned != nil {
			return res.abandoned
		}
		var wait time.Duration
		switch {
		case res.err != nil || (res.failed > 0 && res.published == 0):
			wait = b.next(r.cfg.MaxBackoff)
			if res.err != nil && ctx.Err() == nil {
				r.log.WarnContext(ctx, "pass failed", "error", res.err, "backoff", wait)
			}
		case res.failed > 0:
			b = backoff{}
			wait = backoffMin // some rows went out: retry the rest soon
		case res.claimed > 0:
			b = backoff{}
			busyUntil = time.Now().Add(busyWindow)
			continue // drain again at once
		default:
			wait = r.cfg.PollInterval
			if time.Now().Before(busyUntil) {
				wait = r.cfg.BusyPollInterval
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-r.wake:
		case <-t.C:
		}
		t.Stop()
	}
}

type row struct {
	id        int64
	eventID   outbox.EventID
	slot      int16
	topic     string
	key       []byte
	value     []byte
	headers   []outbox.Header
	createdAt time.Time
	attempts  int32
	epoch     int64
}

type passResult struct {
	claimed, published, failed int
	err                        error
	abandoned                  <-chan struct{} // set when stop abandoned an in-flight send
}

// pass claims one batch, sends it and records the outcome.
func (r *Relay) pass(ctx context.Context, p sarama.SyncProducer, nextSlot *int) passResult {
	start := time.Now()
	var rows []row
	var err error
	if pre := r.pre; pre != nil {
		r.pre = nil
		<-pre.done
		rows, err = pre.rows, pre.err
	}
	if err != nil || len(rows) == 0 {
		rows, err = r.claim(ctx, *nextSlot, r.finishingIDs(nil))
	}
	if err != nil {
		return passResult{err: fmt.Errorf("claim: %w", err)}
	}
	if len(rows) == 0 {
		return passResult{}
	}
	*nextSlot = (int(rows[len(rows)-1].slot) + 1) % outbox.Slots

	// A full-looking batch means a backlog: claim the next batch while this
	// one is sent, skipping this batch's rows (and those still being
	// deleted). It is used only if this batch goes out whole; otherwise a
	// key may have a failed row that its later rows must not overtake.
	if len(rows) >= rowsPerSlot && ctx.Err() == nil {
		exclude := make([]int64, 0, len(rows))
		for i := range rows {
			exclude = append(exclude, rows[i].id)
		}
		exclude = r.finishingIDs(exclude)
		job := &claimJob{done: make(chan struct{})}
		first := *nextSlot
		go func() {
			defer close(job.done)
			job.rows, job.err = r.claim(ctx, first, exclude)
		}()
		r.pre = job
	}

	claimed := time.Now()
	msgs := make([]*sarama.ProducerMessage, len(rows))
	for i := range rows {
		msgs[i] = toMessage(&rows[i], i)
	}
	outcome, abandoned := r.sendWaves(ctx, p, rows, msgs)
	sentAt := time.Now()
	if abandoned != nil {
		return passResult{claimed: len(rows), abandoned: abandoned}
	}
	var (
		okIDs, okEpochs, badIDs, badEpochs []int64
		badErrs                            []string
		transient                          int
		firstErr                           error
	)
	for i := range rows {
		e, tried := outcome[i]
		switch {
		case !tried: // held back behind a failed row of its key, or stopping
		case e == nil:
			okIDs = append(okIDs, rows[i].id)
			okEpochs = append(okEpochs, rows[i].epoch)
		case permanent(e):
			badIDs = append(badIDs, rows[i].id)
			badEpochs = append(badEpochs, rows[i].epoch)
			badErrs = append(badErrs, e.Error())
			r.log.Warn("publish failed permanently", "topic", rows[i].topic, "row_id", rows[i].id,
				"event_id", rows[i].eventID.String(), "attempt", rows[i].attempts+1, "error", e)
		default:
			transient++
			if firstErr == nil {
				firstErr = e
			}
		}
	}
	res := passResult{claimed: len(rows), published: len(okIDs), failed: transient + len(badIDs)}
	if transient > 0 {
		res.err = fmt.Errorf("send: %d of %d records failed, will retry: %w", transient, len(rows), firstErr)
	}
	r.retried.Add(uint64(transient))
	if len(okIDs) < len(rows) {
		r.dropPrefetch()
	}
	// One finish at a time: wait for the previous batch's.
	if r.fin != nil {
		<-r.fin.done
		r.fin = nil
	}
	if len(okIDs)+len(badIDs) == 0 {
		return res
	}
	// Record the outcome even when stopping: these records are in Kafka.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.LeaseTTL)
	finish := func() error {
		defer cancel()
		var deleted, parked int
		if err := r.cfg.Pool.QueryRow(fctx, finishSQL, okIDs, okEpochs, badIDs, badEpochs, badErrs, r.cfg.MaxAttempts).Scan(&deleted, &parked); err != nil {
			// The records went out but the rows stay: they will be sent again
			// (same event ids). That is the at-least-once window.
			return fmt.Errorf("record outcome of %d rows: %w", len(rows), err)
		}
		if deleted < len(okIDs) {
			r.log.Info("lane changed hands during the batch; the new owner may send some rows again", "sent", len(okIDs), "deleted", deleted)
		}
		lat := time.Since(start)
		r.log.Debug("batch", "rows", len(rows), "published", len(okIDs), "claim", claimed.Sub(start), "send", sentAt.Sub(claimed), "finish", time.Since(sentAt))
		r.published.Add(uint64(len(okIDs)))
		r.retried.Add(uint64(len(badIDs) - parked))
		r.parked.Add(uint64(parked))
		r.batches.Add(1)
		r.latLast.Store(int64(lat))
		r.latTotal.Add(int64(lat))
		for {
			m := r.latMax.Load()
			if int64(lat) <= m || r.latMax.CompareAndSwap(m, int64(lat)) {
				break
			}
		}
		if parked > 0 {
			r.log.Error("rows parked after repeated permanent failures", "rows", parked, "max_attempts", r.cfg.MaxAttempts)
		}
		return nil
	}
	if res.failed > 0 || ctx.Err() != nil {
		if err := finish(); err != nil {
			res.err = err
		}
		return res
	}
	// All went out: delete in the background while the next batch is claimed
	// and sent. The next claim skips these rows; if the delete fails they
	// are found again later and sent again (same event ids, after their
	// key's earlier records, so a deduping consumer sees the same order).
	job := &finishJob{done: make(chan struct{}), ids: okIDs}
	go func() {
		defer close(job.done)
		if err := finish(); err != nil && ctx.Err() == nil {
			r.log.Warn("recording a batch failed; its rows will be sent again", "error", err)
		}
	}()
	r.fin = job
	return res
}

// claimJob is the next batch, claimed while the current one is sent.
type claimJob struct {
	done chan struct{}
	rows []row
	err  error
}

func (r *Relay) dropPrefetch() {
	if r.pre != nil {
		<-r.pre.done
		r.pre = nil
	}
}

// finishingIDs appends the ids whose background delete is still running.
func (r *Relay) finishingIDs(ids []int64) []int64 {
	if r.fin == nil {
		return ids
	}
	select {
	case <-r.fin.done:
		r.fin = nil
		return ids
	default:
		return append(ids, r.fin.ids...) // acknowledged, delete still running
	}
}

// finishJob is a batch whose rows are being deleted in the background.
type finishJob struct {
	done chan struct{}
	ids  []int64
}

// waitFinish waits for the background delete, if any.
func (r *Relay) waitFinish() {
	if r.fin != nil {
		<-r.fin.done
		r.fin = nil
	}
}

// sendWaves sends a batch so that no record can overtake an earlier record
// of its key: each wave holds at most one row per (topic, key), in id order,
// and once a row fails, the later rows of its key are held back until the
// next pass. One SendMessages call cannot promise that by itself: sarama
// fails a message whose partition leader it cannot find at that moment and
// goes on with the next one, which may then succeed. With distinct keys a
// batch is one wave; a hot key costs one produce round trip per row.
//
// It returns each tried row's error (nil: acknowledged). If ctx is canceled
// during a send, it waits StopTimeout for the send, then gives up and
// returns a channel closed when the abandoned send has finished.
func (r *Relay) sendWaves(ctx context.Context, p sarama.SyncProducer, rows []row, msgs []*sarama.ProducerMessage) (map[int]error, <-chan struct{}) {
	outcome := make(map[int]error, len(rows))
	blocked := map[string]bool{}
	pending := make([]int, len(rows))
	for i := range pending {
		pending[i] = i
	}
	keyOf := func(i int) string {
		if rows[i].key == nil {
			return "\x00nokey" + strconv.Itoa(i) // no key, no order to keep
		}
		return rows[i].topic + "\x00" + string(rows[i].key)
	}
	for len(pending) > 0 && ctx.Err() == nil {
		var wave []*sarama.ProducerMessage
		var waveIdx, rest []int
		inWave := map[string]bool{}
		for _, i := range pending {
			k := keyOf(i)
			switch {
			case blocked[k]:
			case inWave[k]:
				rest = append(rest, i)
			default:
				inWave[k] = true
				wave = append(wave, msgs[i])
				waveIdx = append(waveIdx, i)
			}
		}
		if len(wave) == 0 {
			break
		}
		sendErr, abandoned := r.send(ctx, p, wave)
		if abandoned != nil {
			return nil, abandoned
		}
		failedErr := map[int]error{}
		if sendErr != nil {
			var perrs sarama.ProducerErrors
			if errors.As(sendErr, &perrs) {
				for _, pe := range perrs {
					if i, ok := pe.Msg.Metadata.(int); ok {
						failedErr[i] = pe.Err
					}
				}
			} else {
				for _, i := range waveIdx {
					failedErr[i] = sendErr
				}
			}
		}
		allTransient := len(failedErr) == len(wave)
		for _, i := range waveIdx {
			e := failedErr[i]
			outcome[i] = e
			if e != nil {
				blocked[keyOf(i)] = true
				if permanent(e) {
					allTransient = false
				}
			}
		}
		if allTransient && len(failedErr) > 0 {
			break // the broker is unreachable: back off instead of trying the next wave
		}
		pending = rest
	}
	return outcome, nil
}

// send runs one SendMessages. If ctx is canceled meanwhile it waits up to
// StopTimeout; after that it abandons the send (the rows stay in the outbox)
// and returns a channel closed when the send finally returns.
func (r *Relay) send(ctx context.Context, p sarama.SyncProducer, msgs []*sarama.ProducerMessage) (error, <-chan struct{}) {
	done := make(chan error, 1)
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		done <- p.SendMessages(msgs)
	}()
	select {
	case err := <-done:
		return err, nil
	case <-ctx.Done():
	}
	t := time.NewTimer(r.cfg.StopTimeout)
	defer t.Stop()
	select {
	case err := <-done:
		return err, nil
	case <-t.C:
		r.log.Warn("stop: abandoned an in-flight send, its rows stay in the outbox", "rows", len(msgs))
		return nil, sent
	}
}

func (r *Relay) claim(ctx context.Context, firstSlot int, exclude []int64) ([]row, error) {
	if exclude == nil {
		exclude = []int64{}
	}
	rows, err := r.cfg.Pool.Query(ctx, claimSQL, r.id, r.cfg.BatchSize, r.cfg.Lanes, firstSlot, rowsPerSlot, exclude)
	if err != nil {
		return nil, err
	}
	out := make([]row, 0, 64)
	for rows.Next() {
		var x row
		if err := rows.Scan(&x.id, &x.eventID, &x.slot, &x.topic, &x.key, &x.value, &x.headers, &x.createdAt, &x.attempts, &x.epoch); err != nil {
			rows.Close()
			return nil, err
		}
		out = append(out, x)
	}
	return out, rows.Err()
}

func toMessage(x *row, i int) *sarama.ProducerMessage {
	m := &sarama.ProducerMessage{Topic: x.topic, Metadata: i}
	if x.key != nil {
		m.Key = sarama.ByteEncoder(x.key)
	}
	if x.value != nil {
		m.Value = sarama.ByteEncoder(x.value)
	}
	m.Headers = make([]sarama.RecordHeader, 0, len(x.headers)+2)
	for _, h := range x.headers {
		if h.Key == EventIDHeader || h.Key == CreatedAtHeader {
			continue
		}
		m.Headers = append(m.Headers, sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
	}
	m.Headers = append(m.Headers,
		sarama.RecordHeader{Key: []byte(EventIDHeader), Value: []byte(x.eventID.String())},
		sarama.RecordHeader{Key: []byte(CreatedAtHeader), Value: []byte(x.createdAt.UTC().Format(time.RFC3339Nano))},
	)
	return m
}

// permanent reports whether a send error will not go away by retrying: the
// record or its topic is wrong. Everything else (broker down, leader
// moving, timeouts) is transient and never parks a row.
func permanent(err error) bool {
	var cerr sarama.ConfigurationError
	if errors.As(err, &cerr) { // e.g. larger than Producer.MaxMessageBytes
		return true
	}
	for _, k := range []sarama.KError{
		sarama.ErrMessageSizeTooLarge, sarama.ErrUnknownTopicOrPartition, sarama.ErrInvalidTopic,
		sarama.ErrTopicAuthorizationFailed, sarama.ErrMessageSetSizeTooLarge, sarama.ErrInvalidRecord,
		sarama.ErrPolicyViolation,
	} {
		if errors.Is(err, k) {
			return true
		}
	}
	return false
}

const backoffMin = 100 * time.Millisecond

// backoff is capped exponential backoff with jitter.
type backoff struct{ d time.Duration }

func (b *backoff) next(limit time.Duration) time.Duration {
	if b.d == 0 {
		b.d = backoffMin
	} else {
		b.d = min(2*b.d, limit)
	}
	return b.d/2 + rand.N(b.d/2+1)
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
