package harness

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func tenantRec(t *testing.T, topic string, p int32, off int64, ev TenantEvent) TenantRecord {
	v, err := json.Marshal(ev)
	require.NoError(t, err)
	return TenantRecord{Topic: topic, Partition: p, Offset: off, Key: ev.Key, Value: v}
}

// The tenants verifier finds each kind of violation, and counts a copy
// published again later as a duplicate, not an inversion.
func TestVerifyTenants(t *testing.T) {
	a := TenantExpect{Tenant: "a", Topic: "tenant.a", Events: map[int]map[string][]int64{
		1: {"a-k0": {1, 2, 3}, "a-k1": {1, 2}},
		2: {"a-k0": {1}},
	}}
	b := TenantExpect{Tenant: "b", Topic: "tenant.b", Events: map[int]map[string][]int64{1: {"b-k0": {1}}}}
	ev := func(tenant string, epoch int, key string, seq int64) TenantEvent {
		return TenantEvent{Tenant: tenant, Epoch: epoch, Key: key, Seq: seq}
	}
	recs := []TenantRecord{
		tenantRec(t, "tenant.a", 0, 0, ev("a", 1, "a-k0", 1)),
		tenantRec(t, "tenant.a", 0, 1, ev("a", 1, "a-k0", 3)), // 2 arrives after 3: an inversion
		tenantRec(t, "tenant.a", 0, 2, ev("a", 1, "a-k0", 2)),
		tenantRec(t, "tenant.a", 0, 3, ev("a", 1, "a-k0", 1)), // a later copy: a duplicate
		tenantRec(t, "tenant.a", 0, 4, ev("a", 2, "a-k0", 1)), // epoch 2 starts again at 1: no inversion
		tenantRec(t, "tenant.a", 1, 0, ev("a", 1, "a-k1", 1)), // a-k1 seq 2 lost
		tenantRec(t, "tenant.a", 2, 0, ev("a", 1, "a-k1", 9)), // never committed, and a second partition
		tenantRec(t, "tenant.a", 3, 0, ev("b", 1, "b-k0", 1)), // b's event on a's topic
	}
	vs := VerifyTenants([]TenantExpect{a, b}, recs)
	va, vb := vs[0], vs[1]
	require.Equal(t, int64(6), va.Events)
	require.Equal(t, int64(5), va.Published)
	require.Equal(t, int64(1), va.Lost)
	require.Equal(t, int64(1), va.Duplicates)
	require.Equal(t, int64(1), va.Inversions)
	require.Equal(t, int64(1), va.SplitKeys)
	require.Equal(t, int64(1), va.Phantom)
	require.Equal(t, int64(1), va.Foreign)
	require.True(t, va.Failed())
	require.Equal(t, int64(1), vb.Lost, "b's event on a's topic does not count as b's")
}
