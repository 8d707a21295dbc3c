package harness

import (
	"encoding/json"
	"testing"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"
)

func TestCheckEffectsFindsEachViolation(t *testing.T) {
	orders := map[string]int64{"a-1": 1, "a-2": 2, "a-3": 3, "b-1": 1}
	e := func(id int64, order, acct string, seq int64) effect {
		return effect{id: id, orderID: order, account: acct, seq: seq, offset: id}
	}
	t.Run("clean", func(t *testing.T) {
		var v Verdict
		checkEffects(&v, orders, []effect{e(1, "a-1", "a", 1), e(2, "b-1", "b", 1), e(3, "a-2", "a", 2), e(4, "a-3", "a", 3)})
		require.True(t, v.OK(), v.First)
	})
	t.Run("duplicate", func(t *testing.T) {
		var v Verdict
		checkEffects(&v, orders, []effect{e(1, "a-1", "a", 1), e(2, "a-2", "a", 2), e(3, "a-3", "a", 3), e(4, "b-1", "b", 1), e(5, "a-2", "a", 2)})
		require.EqualValues(t, 1, v.DuplicateEffects)
		require.Contains(t, v.First[0], "DUPLICATE effect for order a-2")
	})
	t.Run("lost and phantom", func(t *testing.T) {
		var v Verdict
		checkEffects(&v, orders, []effect{e(1, "a-1", "a", 1), e(2, "a-2", "a", 2), e(3, "b-1", "b", 1), e(4, "c-1", "c", 1)})
		require.EqualValues(t, 2, v.Lost) // a-3 missing, c-1 unknown
	})
	t.Run("inversion", func(t *testing.T) {
		var v Verdict
		checkEffects(&v, orders, []effect{e(1, "a-2", "a", 2), e(2, "a-1", "a", 1), e(3, "a-3", "a", 3), e(4, "b-1", "b", 1)})
		require.EqualValues(t, 1, v.OrderInversions)
		require.Contains(t, v.First[0], "ORDER INVERSION in effects of account a: seq 1")
	})
}

func TestCheckRecordsFindsEachViolation(t *testing.T) {
	byOrder := map[string]effect{"a-1": {orderID: "a-1"}, "a-2": {orderID: "a-2"}, "b-1": {orderID: "b-1"}}
	rec := func(p int32, off int64, order, acct string, seq int64) *sarama.ConsumerMessage {
		v, _ := json.Marshal(payment{OrderID: order, Account: acct, Seq: seq})
		return &sarama.ConsumerMessage{Topic: PaymentsTopic, Partition: p, Offset: off, Value: v}
	}
	t.Run("duplicates are counted, not violations", func(t *testing.T) {
		var v Verdict
		// The relay's crash window: a-1, a-2 sent again after a-2.
		require.NoError(t, checkRecords(&v, []*sarama.ConsumerMessage{rec(0, 0, "a-1", "a", 1), rec(0, 1, "a-2", "a", 2),
			rec(0, 2, "a-1", "a", 1), rec(0, 3, "a-2", "a", 2), rec(1, 0, "b-1", "b", 1)}, byOrder))
		require.True(t, v.OK(), v.First)
		require.EqualValues(t, 2, v.DuplicateRecords)
	})
	t.Run("inversion", func(t *testing.T) {
		var v Verdict
		require.NoError(t, checkRecords(&v, []*sarama.ConsumerMessage{rec(0, 0, "a-2", "a", 2), rec(0, 1, "a-1", "a", 1), rec(1, 0, "b-1", "b", 1)}, byOrder))
		require.EqualValues(t, 1, v.OrderInversions)
	})
	t.Run("key on two partitions", func(t *testing.T) {
		var v Verdict
		require.NoError(t, checkRecords(&v, []*sarama.ConsumerMessage{rec(0, 0, "a-1", "a", 1), rec(1, 0, "a-2", "a", 2), rec(1, 1, "b-1", "b", 1)}, byOrder))
		require.EqualValues(t, 1, v.OrderInversions)
		require.Contains(t, v.First[0], "KEY ON TWO PARTITIONS")
	})
	t.Run("lost", func(t *testing.T) {
		var v Verdict
		require.NoError(t, checkRecords(&v, []*sarama.ConsumerMessage{rec(0, 0, "a-1", "a", 1), rec(1, 0, "b-1", "b", 1)}, byOrder))
		require.EqualValues(t, 1, v.Lost)
		require.Contains(t, v.First[0], "LOST payment event for order a-2")
	})
}

func TestScheduleIsSeededAndComplete(t *testing.T) {
	a, b := Schedule(42, 3), Schedule(42, 3)
	require.Equal(t, a, b, "the same seed replays the same schedule")
	require.NotEqual(t, a, Schedule(43, 3))
	n := map[Fault]int{}
	for _, f := range a {
		n[f]++
	}
	for _, f := range AllFaults {
		require.Equal(t, 3, n[f], f)
	}
}
