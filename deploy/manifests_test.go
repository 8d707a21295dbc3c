package deploy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// The manifests are decoded into these types with unknown fields rejected:
// a field the test does not know is a field it would not check, so adding one
// to a manifest means teaching the test about it.

type objectMeta struct {
	Name        string            `yaml:"name"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type typeMeta struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
}

type labelSelector struct {
	MatchLabels map[string]string `yaml:"matchLabels"`
}

type deployment struct {
	typeMeta `yaml:",inline"`
	Metadata objectMeta `yaml:"metadata"`
	Spec     struct {
		Replicas int           `yaml:"replicas"`
		Selector labelSelector `yaml:"selector"`
		Template podTemplate   `yaml:"template"`
	} `yaml:"spec"`
}

type cronJob struct {
	typeMeta `yaml:",inline"`
	Metadata objectMeta `yaml:"metadata"`
	Spec     struct {
		Schedule                   string `yaml:"schedule"`
		ConcurrencyPolicy          string `yaml:"concurrencyPolicy"`
		StartingDeadlineSeconds    int    `yaml:"startingDeadlineSeconds"`
		SuccessfulJobsHistoryLimit int    `yaml:"successfulJobsHistoryLimit"`
		FailedJobsHistoryLimit     int    `yaml:"failedJobsHistoryLimit"`
		JobTemplate                struct {
			Spec struct {
				BackoffLimit          int         `yaml:"backoffLimit"`
				ActiveDeadlineSeconds int         `yaml:"activeDeadlineSeconds"`
				Template              podTemplate `yaml:"template"`
			} `yaml:"spec"`
		} `yaml:"jobTemplate"`
	} `yaml:"spec"`
}

type podMonitor struct {
	typeMeta `yaml:",inline"`
	Metadata objectMeta `yaml:"metadata"`
	Spec     struct {
		Selector            labelSelector `yaml:"selector"`
		PodMetricsEndpoints []struct {
			Port     string `yaml:"port"`
			Path     string `yaml:"path"`
			Interval string `yaml:"interval"`
		} `yaml:"podMetricsEndpoints"`
	} `yaml:"spec"`
}

type prometheusRule struct {
	typeMeta `yaml:",inline"`
	Metadata objectMeta `yaml:"metadata"`
	Spec     struct {
		Groups []any `yaml:"groups"`
	} `yaml:"spec"`
}

type kustomization struct {
	typeMeta  `yaml:",inline"`
	Resources []string `yaml:"resources"`
	Images    []struct {
		Name    string `yaml:"name"`
		NewName string `yaml:"newName"`
		NewTag  string `yaml:"newTag"`
	} `yaml:"images"`
}

type podTemplate struct {
	Metadata objectMeta `yaml:"metadata"`
	Spec     struct {
		TerminationGracePeriodSeconds *int   `yaml:"terminationGracePeriodSeconds"`
		RestartPolicy                 string `yaml:"restartPolicy"`
		SecurityContext               struct {
			RunAsNonRoot   *bool             `yaml:"runAsNonRoot"`
			RunAsUser      *int64            `yaml:"runAsUser"`
			RunAsGroup     *int64            `yaml:"runAsGroup"`
			SeccompProfile map[string]string `yaml:"seccompProfile"`
		} `yaml:"securityContext"`
		InitContainers []container `yaml:"initContainers"`
		Containers     []container `yaml:"containers"`
	} `yaml:"spec"`
}

type container struct {
	Name    string   `yaml:"name"`
	Image   string   `yaml:"image"`
	Command []string `yaml:"command"`
	Args    []string `yaml:"args"`
	Env     []struct {
		Name      string  `yaml:"name"`
		Value     *string `yaml:"value"`
		ValueFrom *struct {
			SecretKeyRef *struct {
				Name     string `yaml:"name"`
				Key      string `yaml:"key"`
				Optional bool   `yaml:"optional"`
			} `yaml:"secretKeyRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	LivenessProbe   *probe                       `yaml:"livenessProbe"`
	ReadinessProbe  *probe                       `yaml:"readinessProbe"`
	Resources       map[string]map[string]string `yaml:"resources"`
	SecurityContext struct {
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
		Capabilities             struct {
			Drop []string `yaml:"drop"`
		} `yaml:"capabilities"`
	} `yaml:"securityContext"`
}

type probe struct {
	HTTPGet struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
	PeriodSeconds    int `yaml:"periodSeconds"`
	TimeoutSeconds   int `yaml:"timeoutSeconds"`
	FailureThreshold int `yaml:"failureThreshold"`
}

// manifests is deploy/kubernetes, decoded.
type manifests struct {
	kustomization  kustomization
	files          []string // every YAML file but kustomization.yaml
	deployments    []*deployment
	cronJobs       []*cronJob
	podMonitors    []*podMonitor
	prometheusRule []*prometheusRule
}

var kubeDir = filepath.Join(root, "deploy", "kubernetes")

func loadManifests(t *testing.T) *manifests {
	t.Helper()
	m := &manifests{}
	names, err := filepath.Glob(filepath.Join(kubeDir, "*.yaml"))
	require.NoError(t, err)
	for _, path := range names {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		file := filepath.Base(path)
		if file == "kustomization.yaml" {
			strictDecode(t, file, b, &m.kustomization)
			continue
		}
		m.files = append(m.files, file)
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for {
			var doc yaml.Node
			err := dec.Decode(&doc)
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err, file)
			raw, err := yaml.Marshal(&doc)
			require.NoError(t, err)
			var tm typeMeta
			require.NoError(t, yaml.Unmarshal(raw, &tm), file)
			switch tm.Kind {
			case "Deployment":
				m.deployments = append(m.deployments, strictDecode(t, file, raw, &deployment{}))
			case "CronJob":
				m.cronJobs = append(m.cronJobs, strictDecode(t, file, raw, &cronJob{}))
			case "PodMonitor":
				m.podMonitors = append(m.podMonitors, strictDecode(t, file, raw, &podMonitor{}))
			case "PrometheusRule":
				m.prometheusRule = append(m.prometheusRule, strictDecode(t, file, raw, &prometheusRule{}))
			default:
				t.Fatalf("%s: kind %q: deploy_test.go does not check it; teach it", file, tm.Kind)
			}
		}
	}
	return m
}

func strictDecode[T any](t *testing.T, file string, b []byte, v T) T {
	t.Helper()
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	require.NoError(t, dec.Decode(v), "%s: a field deploy_test.go does not check (teach it)", file)
	return v
}

// env is a container's environment as the process sees it; secret-backed
// variables get the placeholder secret(name/key).
func (c *container) env(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, e := range c.Env {
		_, dup := out[e.Name]
		require.False(t, dup, "container %s sets %s twice", c.Name, e.Name)
		switch {
		case e.Value != nil:
			out[e.Name] = *e.Value
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			out[e.Name] = "secret(" + e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key + ")"
		default:
			t.Fatalf("container %s: %s has neither a value nor a secretKeyRef", c.Name, e.Name)
		}
	}
	return out
}

// setting is the value a container gives a flag (by flag or environment,
// the flag winning, as the binary does), or its default.
func (c *container) setting(t *testing.T, name string) string {
	t.Helper()
	h := help(t, c.Args[0])
	f := h.flags[name]
	require.NotNil(t, f, "relay %s has no --%s", c.Args[0], name)
	v, ok := c.env(t)[f.env]
	if !ok {
		v = f.def
	}
	for i, a := range c.Args {
		if a == "--"+name && i+1 < len(c.Args) {
			v = c.Args[i+1]
		} else if strings.HasPrefix(a, "--"+name+"=") {
			v = strings.TrimPrefix(a, "--"+name+"=")
		}
	}
	return v
}

// checkContainer: the container runs the image's entrypoint (the binary)
// with a command it has, positional words that command takes, and flags and
// environment variables that command reads, each with a value of its kind.
func checkContainer(t *testing.T, m *manifests, c *container) {
	t.Helper()
	require.Empty(t, c.Command, "container %s: leave command to the image's ENTRYPOINT (the binary); put the subcommand in args", c.Name)
	require.NotEmpty(t, c.Args, "container %s: args name the relay's command", c.Name)
	image, _, _ := strings.Cut(c.Image, ":")
	require.Len(t, m.kustomization.Images, 1)
	require.Equal(t, m.kustomization.Images[0].Name, image, "container %s: the kustomization's image is the one every container runs", c.Name)

	h := help(t, c.Args[0])
	pos := 0
	for i := 1; i < len(c.Args); i++ {
		a := c.Args[i]
		if !strings.HasPrefix(a, "-") {
			require.Less(t, pos, len(h.positional), "container %s: relay %s takes no argument %q", c.Name, c.Args[0], a)
			if words := h.positional[pos]; words != nil {
				require.Contains(t, words, a, "container %s: relay %s's argument", c.Name, c.Args[0])
			}
			pos++
			continue
		}
		name, v, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		f := h.flags[name]
		require.NotNil(t, f, "container %s: relay %s has no flag --%s", c.Name, c.Args[0], name)
		if !hasValue {
			v = "true"
			if f.def != "false" && i+1 < len(c.Args) {
				i++
				v = c.Args[i]
			}
		}
		require.NoError(t, checkValue(f, v), "container %s: --%s", c.Name, name)
	}
	for name, v := range c.env(t) {
		f := h.envs[name]
		require.NotNil(t, f, "container %s: relay %s does not read %s", c.Name, c.Args[0], name)
		if !strings.HasPrefix(v, "secret(") {
			require.NoError(t, checkValue(f, v), "container %s: %s", c.Name, name)
		}
	}
	for _, req := range []string{"database-url", "kafka-brokers"} {
		if f := h.flags[req]; f != nil {
			require.NotEmpty(t, c.setting(t, req), "container %s: relay %s needs %s", c.Name, c.Args[0], f.env)
		}
	}
	ape := c.SecurityContext.AllowPrivilegeEscalation
	require.True(t, ape != nil && !*ape, "container %s: allowPrivilegeEscalation: false", c.Name)
	require.Equal(t, []string{"ALL"}, c.SecurityContext.Capabilities.Drop, "container %s: drop every capability", c.Name)
}

// checkPodSecurity: the pod runs as the image's non-root user.
func checkPodSecurity(t *testing.T, what string, p *podTemplate, uid int64) {
	t.Helper()
	sc := p.Spec.SecurityContext
	require.NotNil(t, sc.RunAsNonRoot, "%s: runAsNonRoot", what)
	require.True(t, *sc.RunAsNonRoot, "%s: runAsNonRoot", what)
	require.NotNil(t, sc.RunAsUser, "%s: runAsUser", what)
	require.Equal(t, uid, *sc.RunAsUser, "%s: runAsUser is the Dockerfile's USER", what)
}

func dockerfileUID(t *testing.T) int64 {
	t.Helper()
	df, err := parseDockerfile(filepath.Join(root, "deploy", "Dockerfile"))
	require.NoError(t, err)
	uid, _, _ := strings.Cut(df.imageUser(), ":")
	n, err := strconv.ParseInt(uid, 10, 64)
	require.NoError(t, err)
	return n
}

// TestManifests checks deploy/kubernetes against the binary: every command,
// argument, flag and environment variable a container uses is one `relay
// <command> --help` lists, with a value of its kind; the relay's probes ask
// the paths the binary serves on the port its --http-addr listens on; the
// grace period outlasts its --shutdown-timeout; `relay migrate up` runs
// before the relay; cleanup is a CronJob of one-pass `relay cleanup`, and
// the relay pods do not also prune; pods run as the image's non-root user;
// the PodMonitor scrapes /metrics of the relay's pods; the kustomization
// lists every manifest.
func TestManifests(t *testing.T) {
	t.Parallel()
	m := loadManifests(t)
	uid := dockerfileUID(t)

	res := slices.Clone(m.kustomization.Resources)
	sort.Strings(res)
	require.Equal(t, m.files, res, "kustomization.yaml lists every manifest of deploy/kubernetes")

	require.Len(t, m.deployments, 1, "one Deployment: the relay")
	d := m.deployments[0]
	require.Equal(t, d.Spec.Selector.MatchLabels, pick(d.Spec.Template.Metadata.Labels, d.Spec.Selector.MatchLabels), "the Deployment's selector matches its pods")
	checkPodSecurity(t, "Deployment "+d.Metadata.Name, &d.Spec.Template, uid)
	for i := range d.Spec.Template.Spec.InitContainers {
		checkContainer(t, m, &d.Spec.Template.Spec.InitContainers[i])
	}
	require.Len(t, d.Spec.Template.Spec.Containers, 1)
	relay := &d.Spec.Template.Spec.Containers[0]
	checkContainer(t, m, relay)
	require.Equal(t, []string{"run"}, relay.Args[:1], "the Deployment runs `relay run`")
	require.True(t, slices.ContainsFunc(d.Spec.Template.Spec.InitContainers, func(c container) bool {
		return slices.Equal(c.Args, []string{"migrate", "up"})
	}), "an init container runs `relay migrate up` before the relay starts")

	checkRelayHTTP(t, relay)
	checkGracePeriod(t, &d.Spec.Template, relay)

	require.Len(t, m.cronJobs, 1, "one CronJob: cleanup")
	cj := m.cronJobs[0]
	require.Equal(t, "Forbid", cj.Spec.ConcurrencyPolicy, "one cleanup pass at a time")
	pod := &cj.Spec.JobTemplate.Spec.Template
	checkPodSecurity(t, "CronJob "+cj.Metadata.Name, pod, uid)
	require.Contains(t, []string{"Never", "OnFailure"}, pod.Spec.RestartPolicy)
	require.Len(t, pod.Spec.Containers, 1)
	cleanup := &pod.Spec.Containers[0]
	checkContainer(t, m, cleanup)
	require.Equal(t, "cleanup", cleanup.Args[0], "the CronJob runs one pass: `relay cleanup`")
	require.Contains(t, help(t, "cleanup").text, "Run one cleanup pass")
	require.Zero(t, mustDuration(t, relay.setting(t, "cleanup-interval")),
		"cleanup runs as the CronJob: the relay pods set PGBOX_CLEANUP_INTERVAL=0s so they do not prune too")

	require.Len(t, m.podMonitors, 1)
	pm := m.podMonitors[0]
	require.Equal(t, pm.Spec.Selector.MatchLabels, pick(d.Spec.Template.Metadata.Labels, pm.Spec.Selector.MatchLabels), "the PodMonitor selects the relay's pods")
	require.Len(t, pm.Spec.PodMetricsEndpoints, 1)
	ep := pm.Spec.PodMetricsEndpoints[0]
	require.Equal(t, "/metrics", ep.Path)
	require.Contains(t, help(t, "run").text, ep.Path, "relay run serves %s", ep.Path)
	requireNamedPort(t, relay, ep.Port)

	require.Len(t, m.prometheusRule, 1, "prometheusrule.yaml, generated from docs/alerts.yml")
}

// checkRelayHTTP: the container port is --http-addr's port, and the probes
// ask it for /healthz (liveness) and /readyz (readiness), paths relay run
// serves.
func checkRelayHTTP(t *testing.T, relay *container) {
	t.Helper()
	_, port, err := net.SplitHostPort(relay.setting(t, "http-addr"))
	require.NoError(t, err, "--http-addr")
	require.NotNil(t, relay.LivenessProbe, "the relay has a liveness probe")
	require.NotNil(t, relay.ReadinessProbe, "the relay has a readiness probe")
	for _, p := range []struct {
		probe *probe
		path  string
	}{{relay.LivenessProbe, "/healthz"}, {relay.ReadinessProbe, "/readyz"}} {
		require.Equal(t, p.path, p.probe.HTTPGet.Path)
		require.Contains(t, help(t, "run").text, p.path, "relay run serves %s", p.path)
		require.Equal(t, port, strconv.Itoa(requireNamedPort(t, relay, p.probe.HTTPGet.Port)),
			"the %s probe's port is --http-addr's", p.path)
	}
	// /readyz waits up to 3s for the database and Kafka.
	require.Greater(t, relay.ReadinessProbe.TimeoutSeconds, 3, "readiness timeoutSeconds")
}

// checkGracePeriod: Kubernetes waits longer than the relay's shutdown
// timeout before it kills the relay.
func checkGracePeriod(t *testing.T, pod *podTemplate, relay *container) {
	t.Helper()
	grace := pod.Spec.TerminationGracePeriodSeconds
	require.NotNil(t, grace, "terminationGracePeriodSeconds (the default 30s is not longer than the relay's default shutdown timeout)")
	timeout := mustDuration(t, relay.setting(t, "shutdown-timeout"))
	require.Greater(t, time.Duration(*grace)*time.Second, timeout,
		"terminationGracePeriodSeconds %d does not outlast --shutdown-timeout %v", *grace, timeout)
}

// requireNamedPort returns the containerPort of c's port called name.
func requireNamedPort(t *testing.T, c *container, name string) int {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	t.Fatalf("container %s has no port named %q", c.Name, name)
	return 0
}

func mustDuration(t *testing.T, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	require.NoError(t, err)
	return d
}

// pick returns the entries of labels whose keys sel has.
func pick(labels, sel map[string]string) map[string]string {
	out := map[string]string{}
	for k := range sel {
		if v, ok := labels[k]; ok {
			out[k] = v
		}
	}
	return out
}
