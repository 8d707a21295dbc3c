package kafkaconf

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/xdg-go/scram"
)

// TestSCRAMClientErrors: the adapter's own errors (a protocol failure it
// detects) name the mechanism and the user, never the password.
func TestSCRAMClientErrors(t *testing.T) {
	t.Parallel()
	c := newSCRAMClientFunc("SCRAM-SHA-256", scram.SHA256)()
	require.NoError(t, c.Begin("alice", "hunter2", ""))
	first, err := c.Step("")
	require.NoError(t, err)
	require.Contains(t, first, "n=alice,r=")
	require.False(t, c.Done())

	// A server nonce that does not extend the client's: a man in the middle
	// or a broken server.
	_, err = c.Step("r=someone-else,s=" + base64.StdEncoding.EncodeToString([]byte("salt")) + ",i=4096")
	require.ErrorContains(t, err, `kafka SASL SCRAM-SHA-256 as user "alice"`)
	require.ErrorContains(t, err, "nonce")
	require.NotContains(t, err.Error(), "hunter2")

	// Too few iterations: refused, not computed with a weak key.
	c = newSCRAMClientFunc("SCRAM-SHA-512", scram.SHA512)()
	require.NoError(t, c.Begin("alice", "hunter2", ""))
	first, err = c.Step("")
	require.NoError(t, err)
	nonce := first[strings.Index(first, "r=")+2:]
	_, err = c.Step("r=" + nonce + "srv,s=" + base64.StdEncoding.EncodeToString([]byte("salt")) + ",i=1")
	require.ErrorContains(t, err, `kafka SASL SCRAM-SHA-512 as user "alice"`)
	require.ErrorContains(t, err, "iterations")

	_, err = newSCRAMClientFunc("SCRAM-SHA-256", scram.SHA256)().Step("")
	require.ErrorContains(t, err, "SCRAM-SHA-256")
}
