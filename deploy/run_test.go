package deploy

import (
	"context"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/internal/testutil"
)

// listenRE finds the HTTP server's bound address in the relay's log, text or
// JSON.
var listenRE = regexp.MustCompile(`http listening.*?"?addr"?[=:]"?([0-9.]+:[0-9]+)`)

// podEnv is the environment a container of the manifests runs with, on this
// machine: its own values, with the Secret's DATABASE_URL pointing at a test
// schema, the brokers at the embedded broker, and the HTTP server on a free
// loopback port (the pod's port is the manifest's; here many tests share the
// host).
func podEnv(t *testing.T, c *container, databaseURL, brokers string) []string {
	t.Helper()
	var env []string
	for k, v := range c.env(t) {
		switch {
		case k == "DATABASE_URL":
			require.Equal(t, "secret(pgbox/DATABASE_URL)", v)
			v = databaseURL
		case k == "KAFKA_BROKERS":
			v = brokers
		case k == "PGBOX_HTTP_ADDR":
			v = "127.0.0.1:0"
		}
		env = append(env, k+"="+v)
	}
	return env
}

// runToEnd runs a container's command to its end and returns its output.
func runToEnd(t *testing.T, c *container, env []string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, relayBin, c.Args...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "container %s: relay %s:\n%s", c.Name, strings.Join(c.Args, " "), out)
	return string(out)
}

// TestManifestsRunAgainstTheBinary runs the manifests' containers as the
// pods would, in order, with their own arguments and environment: the init
// container migrates an empty schema, the relay comes up and its probes'
// paths answer 200 on its HTTP server, it stops on SIGTERM within the pod's
// grace period, and the CronJob's cleanup pass succeeds.
func TestManifestsRunAgainstTheBinary(t *testing.T) {
	t.Parallel()
	m := loadManifests(t)
	db := testdb.Empty(t)
	brokers := strings.Join(kafkatest.New(t).ListenAddrs(), ",")
	pod := &m.deployments[0].Spec.Template

	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		runToEnd(t, c, podEnv(t, c, db.URL, brokers))
	}

	relay := &pod.Spec.Containers[0]
	p := start(t, relay, podEnv(t, relay, db.URL, brokers))
	base := "http://" + p.HTTPAddr(t)
	for _, pr := range []*probe{relay.LivenessProbe, relay.ReadinessProbe} {
		testutil.Eventually(t, 30*time.Second, pr.HTTPGet.Path+" answers 200", func() bool {
			return get(t, base+pr.HTTPGet.Path) == http.StatusOK
		})
	}
	grace := time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
	require.NoError(t, p.Cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-p.Done():
		require.NoError(t, p.Err(), "relay run after SIGTERM:\n%s", p.Output())
	case <-time.After(grace):
		t.Fatalf("relay run outlived the pod's grace period %v after SIGTERM:\n%s", grace, p.Output())
	}

	cj := &m.cronJobs[0].Spec.JobTemplate.Spec.Template.Spec.Containers[0]
	runToEnd(t, cj, podEnv(t, cj, db.URL, brokers))
}

func get(t *testing.T, url string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

func start(t *testing.T, c *container, env []string) *testutil.Proc {
	t.Helper()
	cmd := exec.Command(relayBin, c.Args...)
	cmd.Env = env
	return testutil.StartProc(t, cmd, listenRE)
}
