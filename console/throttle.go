package console

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// Failed logins are throttled per claimed user name and per source address
// (the user name only behind the trusted proxy: see loginKeys), in this
// process: consoles behind one load balancer each keep their own
// count (an attacker spread over n replicas gets n times the attempts; the
// audit trail and the log, which every replica writes, show them all).
const (
	// loginFreeFailures is how many failed logins a user name or a source
	// address gets before the next attempts wait.
	loginFreeFailures = 5
	// loginMaxWait bounds the wait, which doubles with each further failure
	// from one second: a real user locked out by someone else's guesses
	// waits at most this long.
	loginMaxWait = time.Minute
	// loginForget is how long after its last failure a name or address
	// starts afresh.
	loginForget = 15 * time.Minute
	// loginTracked bounds the memory the counts take; past it, entries not
	// waiting are forgotten first.
	loginTracked = 10_000
)

// loginFailures counts failed logins per key ("user:name", "addr:ip").
type loginFailures struct {
	mu   sync.Mutex
	keys map[string]*failure
}

type failure struct {
	n     int
	last  time.Time
	until time.Time // refused until then
}

func sourceAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// loginKeys are the counts a login attempt is checked against and adds
// to: its basic-auth user name, and its source address unless it comes
// through the trusted proxy. Behind the proxy every person shares the
// proxy's address, so one guesser would lock everybody out; there the
// throttle keys on the user only. A request the proxy authenticated (no
// Authorization header) and a bearer token through the proxy have no key:
// they are never throttled (a token has at least 16 characters, and each
// wrong one is still logged and audited).
func (h *Handler) loginKeys(r *http.Request) []string {
	var keys []string
	if !h.auth.viaProxy(r) {
		keys = append(keys, "addr:"+sourceAddr(r))
	}
	if name, _, ok := r.BasicAuth(); ok && name != "" {
		keys = append(keys, userKey(name))
	}
	return keys
}

// userKey is a user name's count; a name is cut as the audit records it,
// so made-up names of any length cost the table little memory.
func userKey(name string) string { return "user:" + claimedName(name) }

// wait returns how long attempts for any of keys must still wait (0: none).
func (l *loginFailures) wait(now time.Time, keys []string) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	var d time.Duration
	for _, k := range keys {
		if f := l.keys[k]; f != nil && f.until.After(now) {
			d = max(d, f.until.Sub(now))
		}
	}
	return d
}

// fail counts a failed login for keys; it reports whether one of them now
// has to wait (just started throttling).
func (l *loginFailures) fail(now time.Time, keys []string) (throttled bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.keys == nil {
		l.keys = map[string]*failure{}
	}
	if len(l.keys) >= loginTracked {
		l.prune(now)
	}
	for _, k := range keys {
		f := l.keys[k]
		if f == nil || now.Sub(f.last) > loginForget {
			f = &failure{}
			l.keys[k] = f
		}
		f.n++
		f.last = now
		if over := f.n - loginFreeFailures; over > 0 {
			f.until = now.Add(min(time.Second<<min(over-1, 16), loginMaxWait))
			throttled = true
		}
	}
	return throttled
}

// succeed forgets the failures of key.
func (l *loginFailures) succeed(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.keys, key)
}

// prune forgets entries not waiting, or all if every one waits.
func (l *loginFailures) prune(now time.Time) {
	for k, f := range l.keys {
		if !f.until.After(now) {
			delete(l.keys, k)
		}
	}
	if len(l.keys) >= loginTracked {
		clear(l.keys)
	}
}
