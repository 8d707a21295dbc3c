package harness

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pgbox/pgbox/internal/pgcluster"
)

// The tenants chaos run (integration_test.TestChaosTenants): many targets
// (schemas of several databases, on two clusters) served by `relay run
// --targets FILE` processes. This file holds its parts: the target list,
// the broker and fleet relay processes, the event value, and the verifier.

// TenantTarget is one line of a target list: name schema database-url.
type TenantTarget struct {
	Name, Schema, URL string
}

// WriteTargetsFile writes the target list to path atomically (a temporary
// file renamed over it), so a relay re-reading it never sees half a file.
func WriteTargetsFile(path string, ts []TenantTarget) error {
	var b strings.Builder
	b.WriteString("# name schema database-url (written by the tenants chaos run)\n")
	for _, t := range ts {
		fmt.Fprintf(&b, "%s %s %s\n", t.Name, t.Schema, t.URL)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// StartBrokerProc starts the harness's broker process (chaosproc broker,
// data in dir/kafka, log in dir/broker.log) on a free loopback port and
// waits until it accepts connections.
func StartBrokerProc(ctx context.Context, bin Binaries, dir string) (*Proc, string, error) {
	port, err := pgcluster.FreePort()
	if err != nil {
		return nil, "", err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	p := &Proc{Name: "broker", Path: bin.Proc, LogPath: filepath.Join(dir, "broker.log"),
		Args: []string{"broker", "--data-dir", filepath.Join(dir, "kafka"), "--port", strconv.Itoa(port)}}
	if err := p.Start(); err != nil {
		return nil, "", err
	}
	if err := waitTCP(ctx, addr, 30*time.Second); err != nil {
		_ = p.Kill()
		return nil, "", err
	}
	return p, addr, nil
}

// FleetRelay is a relay process (not started) serving the target list in
// targetsFile: `relay run --targets FILE`, re-read every second, with the
// chaos run's short leases. It returns the process and its HTTP address.
func FleetRelay(bin Binaries, dir, name, targetsFile, broker string, extra ...string) (*Proc, string, error) {
	port, err := pgcluster.FreePort()
	if err != nil {
		return nil, "", err
	}
	httpAddr := "127.0.0.1:" + strconv.Itoa(port)
	args := []string{"run", "--targets", targetsFile, "--targets-refresh", "1s", "--db-conn-budget", "40",
		"--kafka-brokers", broker, "--instance", name,
		"--lanes", "8", "--heartbeat-interval", "250ms", "--lease-ttl", "1500ms",
		"--cleanup-interval", "0s", "--http-addr", httpAddr,
		"--kafka-timeout", "3s", "--shutdown-timeout", "5s"}
	return &Proc{Name: name, Path: bin.Relay, LogPath: filepath.Join(dir, name+".log"), Args: append(args, extra...),
		Env: []string{"PGBOX_SWEEP_INTERVAL=5s"}}, httpAddr, nil
}

// TenantEvent is a tenant writer's event value: whose it is, which
// incarnation of the tenant's schema wrote it (Epoch: 1, then 2 after the
// schema is dropped and recreated), its key and per-key sequence number
// (from 1 in each epoch), and the time the writer sent it, just before
// COMMIT (unix nanoseconds).
type TenantEvent struct {
	Tenant string `json:"tenant"`
	Epoch  int    `json:"epoch"`
	Key    string `json:"key"`
	Seq    int64  `json:"seq"`
	At     int64  `json:"at"`
}

// TenantRecord is one record read back from a tenant's topic.
type TenantRecord struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       string
	Value     []byte
	Recv      time.Time
}

// TenantExpect is what a tenant committed: per epoch, per key, the
// sequence numbers in its orders table (the truth: a commit whose outcome
// the writer could not know is there or not).
type TenantExpect struct {
	Tenant string
	Topic  string
	Events map[int]map[string][]int64 // epoch → key → seqs
}

// Count is the number of events expected.
func (e TenantExpect) Count() int64 {
	var n int64
	for _, keys := range e.Events {
		for _, s := range keys {
			n += int64(len(s))
		}
	}
	return n
}

// TenantVerdict is one target's verdict.
type TenantVerdict struct {
	Tenant     string
	Events     int64 // committed (orders rows, every epoch)
	Published  int64 // distinct committed events found on the tenant's topic
	Lost       int64 // committed, never on the topic
	Duplicates int64 // extra copies of an event (allowed: at least once)
	// DupByEpoch splits Duplicates by the epoch of the event copied;
	// DupExamples shows a few (epoch, key, seq, offsets).
	DupByEpoch  map[int]int64
	DupExamples []string
	Inversions  int64 // a key's first copies out of seq order
	SplitKeys   int64 // keys found on more than one partition
	Foreign     int64 // records on this tenant's topic that are not its own (another tenant's value, key or an unreadable value)
	Phantom     int64 // events on the topic that were never committed
	Examples    []string
}

// Failed reports whether the verdict breaks a guarantee.
func (v *TenantVerdict) Failed() bool {
	return v.Lost+v.Inversions+v.SplitKeys+v.Foreign+v.Phantom > 0
}

func (v *TenantVerdict) example(format string, args ...any) {
	if len(v.Examples) < 8 {
		v.Examples = append(v.Examples, fmt.Sprintf(format, args...))
	}
}

// VerifyTenants checks every tenant's topic against what it committed:
// every event there (lost), none that was not committed (phantom), none of
// another tenant (foreign), each key on one partition with its first
// copies in seq order (inversions), and counts the extra copies.
func VerifyTenants(expect []TenantExpect, recs []TenantRecord) []*TenantVerdict {
	byTopic := map[string][]TenantRecord{}
	for _, r := range recs {
		byTopic[r.Topic] = append(byTopic[r.Topic], r)
	}
	var out []*TenantVerdict
	for _, e := range expect {
		v := &TenantVerdict{Tenant: e.Tenant, Events: e.Count()}
		out = append(out, v)
		committed := map[[3]string]bool{}
		for ep, keys := range e.Events {
			for k, seqs := range keys {
				for _, s := range seqs {
					committed[[3]string{strconv.Itoa(ep), k, strconv.FormatInt(s, 10)}] = true
				}
			}
		}
		rs := slices.Clone(byTopic[e.Topic])
		slices.SortFunc(rs, func(a, b TenantRecord) int {
			return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
		})
		type keyState struct {
			partition int32
			maxFirst  int64
		}
		keys := map[[2]string]*keyState{}
		seen := map[[3]string]int{}
		for _, r := range rs {
			var ev TenantEvent
			if err := json.Unmarshal(r.Value, &ev); err != nil || ev.Tenant != e.Tenant || ev.Key != r.Key ||
				!strings.HasPrefix(r.Key, e.Tenant+"-") {
				v.Foreign++
				v.example("foreign record on %s p%d@%d: key %q value %.120q", r.Topic, r.Partition, r.Offset, r.Key, r.Value)
				continue
			}
			id := [3]string{strconv.Itoa(ev.Epoch), ev.Key, strconv.FormatInt(ev.Seq, 10)}
			seen[id]++
			if seen[id] > 1 {
				v.Duplicates++
				if v.DupByEpoch == nil {
					v.DupByEpoch = map[int]int64{}
				}
				v.DupByEpoch[ev.Epoch]++
				if len(v.DupExamples) < 3 {
					v.DupExamples = append(v.DupExamples, fmt.Sprintf("epoch %d key %s seq %d again at p%d@%d",
						ev.Epoch, ev.Key, ev.Seq, r.Partition, r.Offset))
				}
				continue
			}
			if !committed[id] {
				v.Phantom++
				v.example("phantom: epoch %d key %s seq %d on p%d@%d was never committed", ev.Epoch, ev.Key, ev.Seq, r.Partition, r.Offset)
			}
			kid := [2]string{strconv.Itoa(ev.Epoch), ev.Key}
			ks := keys[kid]
			if ks == nil {
				ks = &keyState{partition: r.Partition}
				keys[kid] = ks
			} else if ks.partition != r.Partition {
				v.SplitKeys++
				v.example("key %s (epoch %d) on partitions %d and %d", ev.Key, ev.Epoch, ks.partition, r.Partition)
			}
			if ev.Seq < ks.maxFirst {
				v.Inversions++
				v.example("inversion: epoch %d key %s seq %d first at p%d@%d, after seq %d", ev.Epoch, ev.Key, ev.Seq, r.Partition, r.Offset, ks.maxFirst)
			} else {
				ks.maxFirst = ev.Seq
			}
		}
		for id := range committed {
			if seen[id] > 0 {
				v.Published++
				continue
			}
			v.Lost++
			v.example("lost: epoch %s key %s seq %s", id[0], id[1], id[2])
		}
	}
	return out
}
