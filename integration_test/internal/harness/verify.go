package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
)

// Verdict is what the verifier found. Lost, DuplicateEffects and
// OrderInversions must be 0; duplicate Kafka records are allowed (the
// relay's crash window) and counted.
type Verdict struct {
	Produced         int64 // committed orders (orders table)
	Effects          int64 // payments rows (business effects)
	Lost             int64 // orders without an effect, effects without a downstream record, phantom effects
	DuplicateEffects int64 // effects beyond the first for one order
	OrderInversions  int64 // per account: an effect or a downstream record before an earlier seq
	DownstreamRecs   int64 // records read from the payments topic
	DuplicateRecords int64 // downstream records beyond the first per order
	DeadLetters      int64 // pgbox_consumer_dead rows (must be 0: nothing here is poison)
	Parked           int64 // parked outbox rows in either database (must be 0)
	// BelowFloor counts rows the relays' sweeps found below their slot's
	// floor (their ERROR log lines): published late, not lost, but each a
	// hole in the floor's rule (must be 0).
	BelowFloor int64
	// ByClient counts the business effects per Kafka client of the payments
	// member that committed them (sarama, franz).
	ByClient map[string]int64
	// First describes the first violation: the key, and the offsets involved.
	First []string
}

// OK reports whether the guarantees held.
func (v Verdict) OK() bool {
	return v.Lost == 0 && v.DuplicateEffects == 0 && v.OrderInversions == 0 && v.DeadLetters == 0 && v.Parked == 0 &&
		v.BelowFloor == 0
}

func (v *Verdict) violation(format string, args ...any) {
	if len(v.First) < 5 {
		v.First = append(v.First, fmt.Sprintf(format, args...))
	}
}

type effect struct {
	id        int64
	orderID   string
	account   string
	seq       int64
	partition int32
	offset    int64
	member    string
}

// Verify reads the orders and payments tables and the whole payments topic
// and checks: every order has exactly one effect, effects apply each
// account's orders in order, every effect reached the payments topic, and
// first records there are in order per account, on one partition.
func (w *World) Verify(ctx context.Context) (Verdict, error) {
	var v Verdict
	orders, err := w.readOrders(ctx)
	if err != nil {
		return v, err
	}
	v.Produced = int64(len(orders))
	effects, err := w.readEffects(ctx)
	if err != nil {
		return v, err
	}
	v.Effects = int64(len(effects))
	v.ByClient = byClient(effects)
	byOrder := checkEffects(&v, orders, effects)
	if err := w.checkDownstream(ctx, &v, byOrder); err != nil {
		return v, err
	}
	if err := w.countBelowFloor(&v); err != nil {
		return v, err
	}
	return v, w.countLeftovers(ctx, &v)
}

// belowFloorRe matches the relay's log line when its sweep found rows
// below a floor (relay/claim.go), and takes the row count.
var belowFloorRe = regexp.MustCompile(`the sweep found committed rows below their slot.s floor.*?\brows"?[=:](\d+)`)

// countBelowFloor sums the rows the relays' sweeps found below their
// floors, from the relays' logs.
func (w *World) countBelowFloor(v *Verdict) error {
	for _, p := range w.Relays {
		b, err := os.ReadFile(p.LogPath)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return err
		}
		for _, m := range belowFloorRe.FindAllStringSubmatch(string(b), -1) {
			n, _ := strconv.ParseInt(m[1], 10, 64)
			v.BelowFloor += n
			v.violation("%s: its sweep found %d rows below their slot's floor (the floor's rule let them pass)", p.Name, n)
		}
	}
	return nil
}

// byClient counts effects by the client their member ran on (the member
// name's last part, payments-N-client).
func byClient(effects []effect) map[string]int64 {
	out := map[string]int64{}
	for _, e := range effects {
		out[e.member[strings.LastIndex(e.member, "-")+1:]]++
	}
	return out
}

func checkEffects(v *Verdict, orders map[string]int64, effects []effect) map[string]effect {
	byOrder := map[string]effect{}
	last := map[string]effect{}
	for _, e := range effects {
		if first, dup := byOrder[e.orderID]; dup {
			v.DuplicateEffects++
			v.violation("DUPLICATE effect for order %s (account %s): payments rows %d (from %s@%d/%d by %s) and %d (from %s@%d/%d by %s)",
				e.orderID, e.account, first.id, OrdersTopic, first.partition, first.offset, first.member, e.id, OrdersTopic, e.partition, e.offset, e.member)
			continue
		}
		byOrder[e.orderID] = e
		if _, ok := orders[e.orderID]; !ok {
			v.Lost++
			v.violation("PHANTOM effect: payments row %d for order %s, which the orders table does not have", e.id, e.orderID)
		}
		if p, ok := last[e.account]; ok && e.seq <= p.seq {
			v.OrderInversions++
			v.violation("ORDER INVERSION in effects of account %s: seq %d (%s@%d/%d, row %d) after seq %d (%s@%d/%d, row %d)",
				e.account, e.seq, OrdersTopic, e.partition, e.offset, e.id, p.seq, OrdersTopic, p.partition, p.offset, p.id)
		}
		last[e.account] = e
	}
	var lost []string
	for id := range orders {
		if _, ok := byOrder[id]; !ok {
			lost = append(lost, id)
		}
	}
	sort.Strings(lost)
	v.Lost += int64(len(lost))
	for _, id := range lost[:min(3, len(lost))] {
		v.violation("LOST order %s: committed in the orders database, no payment effect", id)
	}
	return byOrder
}

func (w *World) readOrders(ctx context.Context) (map[string]int64, error) {
	conn, err := pgx.Connect(ctx, w.PG.URL(OrdersDB))
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, _ := conn.Query(ctx, `SELECT order_id, seq FROM orders`)
	out := map[string]int64{}
	var id string
	var seq int64
	_, err = pgx.ForEachRow(rows, []any{&id, &seq}, func() error { out[id] = seq; return nil })
	if err != nil {
		return nil, fmt.Errorf("read orders: %w", err)
	}
	return out, nil
}

func (w *World) readEffects(ctx context.Context) ([]effect, error) {
	conn, err := pgx.Connect(ctx, w.PG.URL(PaymentsDB))
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, _ := conn.Query(ctx, `SELECT id, order_id, account, seq, src_partition, src_offset, member FROM payments ORDER BY id`)
	var out []effect
	var e effect
	_, err = pgx.ForEachRow(rows, []any{&e.id, &e.orderID, &e.account, &e.seq, &e.partition, &e.offset, &e.member},
		func() error { out = append(out, e); return nil })
	if err != nil {
		return nil, fmt.Errorf("read payments: %w", err)
	}
	return out, nil
}

func (w *World) countLeftovers(ctx context.Context, v *Verdict) error {
	for _, db := range []string{OrdersDB, PaymentsDB} {
		conn, err := pgx.Connect(ctx, w.PG.URL(db))
		if err != nil {
			return err
		}
		var parked, dead int64
		err = conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM pgbox_outbox WHERE parked_at IS NOT NULL), (SELECT count(*) FROM pgbox_consumer_dead)`).Scan(&parked, &dead)
		_ = conn.Close(ctx)
		if err != nil {
			return fmt.Errorf("count parked rows and dead letters in %s: %w", db, err)
		}
		v.Parked += parked
		v.DeadLetters += dead
		if parked > 0 {
			v.violation("%d PARKED outbox rows in database %s", parked, db)
		}
		if dead > 0 {
			v.violation("%d DEAD LETTERS in database %s (pgbox_consumer_dead)", dead, db)
		}
	}
	return nil
}

type payment struct {
	OrderID string `json:"order_id"`
	Account string `json:"account"`
	Seq     int64  `json:"seq"`
}

// checkDownstream reads the payments topic to its high-water marks.
func (w *World) checkDownstream(ctx context.Context, v *Verdict, byOrder map[string]effect) error {
	recs, err := ReadTopic(ctx, w.Brokers, PaymentsTopic)
	if err != nil {
		return err
	}
	return checkRecords(v, recs, byOrder)
}

// checkRecords checks the payments topic's records (ordered by partition
// and offset) against the effects.
func checkRecords(v *Verdict, recs []*sarama.ConsumerMessage, byOrder map[string]effect) error {
	v.DownstreamRecs = int64(len(recs))
	seen := map[string]bool{}
	type pos struct {
		seq       int64
		partition int32
		offset    int64
	}
	last := map[string]pos{}
	for _, m := range recs {
		var p payment
		if err := json.Unmarshal(m.Value, &p); err != nil {
			return fmt.Errorf("%s/%d@%d is not a payment: %w", PaymentsTopic, m.Partition, m.Offset, err)
		}
		if seen[p.OrderID] {
			v.DuplicateRecords++
			continue
		}
		seen[p.OrderID] = true
		if l, ok := last[p.Account]; ok {
			if l.partition != m.Partition {
				v.OrderInversions++
				v.violation("KEY ON TWO PARTITIONS: account %s at %s/%d@%d and %s/%d@%d", p.Account, PaymentsTopic, l.partition, l.offset, PaymentsTopic, m.Partition, m.Offset)
			} else if p.Seq <= l.seq {
				v.OrderInversions++
				v.violation("ORDER INVERSION downstream, account %s: seq %d at %s/%d@%d after seq %d at @%d", p.Account, p.Seq, PaymentsTopic, m.Partition, m.Offset, l.seq, l.offset)
			}
		}
		last[p.Account] = pos{p.Seq, m.Partition, m.Offset}
	}
	var lost []string
	for id := range byOrder {
		if !seen[id] {
			lost = append(lost, id)
		}
	}
	sort.Strings(lost)
	v.Lost += int64(len(lost))
	for _, id := range lost[:min(3, len(lost))] {
		e := byOrder[id]
		v.violation("LOST payment event for order %s: effect row %d (from %s/%d@%d) never reached %s", id, e.id, OrdersTopic, e.partition, e.offset, PaymentsTopic)
	}
	return nil
}

// ReadTopic reads every partition of topic from its oldest offset up to the
// high-water mark it has when the read starts, ordered by partition and
// offset.
func ReadTopic(ctx context.Context, brokers []string, topic string) ([]*sarama.ConsumerMessage, error) {
	client, err := sarama.NewClient(brokers, KafkaConfig())
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	defer client.Close()
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return nil, err
	}
	defer consumer.Close()
	parts, err := client.Partitions(topic)
	if err != nil {
		return nil, fmt.Errorf("partitions of %s: %w", topic, err)
	}
	var out []*sarama.ConsumerMessage
	for _, p := range parts {
		hwm, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return nil, fmt.Errorf("high-water mark of %s/%d: %w", topic, p, err)
		}
		oldest, err := client.GetOffset(topic, p, sarama.OffsetOldest)
		if err != nil {
			return nil, fmt.Errorf("oldest offset of %s/%d: %w", topic, p, err)
		}
		if hwm <= oldest {
			continue
		}
		pc, err := consumer.ConsumePartition(topic, p, oldest)
		if err != nil {
			return nil, fmt.Errorf("consume %s/%d: %w", topic, p, err)
		}
		err = func() error {
			defer pc.Close()
			timeout := time.NewTimer(2 * time.Minute)
			defer timeout.Stop()
			for {
				select {
				case m := <-pc.Messages():
					out = append(out, m)
					if m.Offset+1 >= hwm {
						return nil
					}
				case err := <-pc.Errors():
					return fmt.Errorf("read %s/%d: %w", topic, p, err)
				case <-timeout.C:
					return fmt.Errorf("read %s/%d: stuck before offset %d", topic, p, hwm)
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}()
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}
