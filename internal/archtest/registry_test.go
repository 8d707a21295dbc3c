package archtest

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// registryHosts are package registries' and mirrors' addresses. The project
// installs through package clients by package name only (go, apt-get, npm),
// so whichever registry or mirror a machine is configured with serves it;
// none is written into the tree.
var registryHosts = []string{
	"registry.npmjs", "registry.yarnpkg", "npmjs.com", "npmjs.org",
	"proxy.golang.org", "sum.golang.org", "goproxy.",
	"deb.debian.org", "security.debian.org", "archive.ubuntu.com", "ports.ubuntu.com",
	"pypi.org", "pythonhosted.org", "crates.io",
	"registry-1.docker.io", "index.docker.io",
}

// TestNoRegistryAddress: no script, doc or code names a package registry's
// host (scripts/pgmatrix.sh once fell back to curl on npm's tarball URL).
func TestNoRegistryAddress(t *testing.T) {
	t.Parallel()
	var bad []string
	eachLine(t, func(rel string, n int, line string) {
		if rel == "internal/archtest/registry_test.go" {
			return
		}
		l := strings.ToLower(line)
		for _, h := range registryHosts {
			if strings.Contains(l, h) {
				bad = append(bad, rel+":"+strconv.Itoa(n)+": "+strings.TrimSpace(line))
				break
			}
		}
	})
	require.Empty(t, bad, "install by package name through the package client (npm, apt-get, go); do not write a registry's address into the project")
}
