package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unicode"
	"unicode/utf8"

	"golang.org/x/crypto/bcrypt"
)

// Role is what an authenticated person may do.
type Role string

const (
	// RoleViewer reads every page and takes no action. The default role.
	RoleViewer Role = "viewer"
	// RoleOperator also retries, discards and replays.
	RoleOperator Role = "operator"
)

// User is a basic-auth login.
type User struct {
	// Name is the login name, recorded in the audit trail.
	Name string
	// PasswordHash is the bcrypt hash of the password (for example from
	// `htpasswd -nbB name password`, the part after the colon). The
	// password itself is never stored.
	PasswordHash string
	// Role defaults to RoleViewer.
	Role Role
}

// Token is a bearer token (Authorization: Bearer <token>), for scripts and
// for proxies that authenticate on the console's behalf.
type Token struct {
	// Name identifies the token's holder in the audit trail (never the token).
	Name string
	// Token is the secret, at least 16 characters; read it from the
	// environment, never from a flag or a file in the repository.
	Token string
	// Role defaults to RoleViewer.
	Role Role
}

// Auth configures authentication. Any mix of the three methods may be set;
// with none, every request is an anonymous viewer.
type Auth struct {
	// Users are the basic-auth logins. Defaults to none.
	Users []User
	// Tokens are the bearer tokens. Defaults to none.
	Tokens []Token
	// ProxyHeader names a request header set by a trusted reverse proxy
	// that authenticated the user (for example "X-Forwarded-User"); its
	// value is the user's name. It is believed only on requests from
	// TrustedProxies, and only with exactly one value: a header given
	// twice or listing several names is refused. Requests from
	// TrustedProxies are throttled after failed logins per user name, not
	// per address. Defaults to "": no proxy authentication.
	ProxyHeader string
	// TrustedProxies are the addresses (CIDR prefixes) ProxyHeader is
	// believed from. Defaults to loopback (127.0.0.0/8 and ::1/128).
	TrustedProxies []netip.Prefix
	// ProxyOperators are the proxy-authenticated users with the operator
	// role; the others are viewers. Defaults to none.
	ProxyOperators []string
}

func (a Auth) enabled() bool { return len(a.Users) > 0 || len(a.Tokens) > 0 || a.ProxyHeader != "" }

func validRole(r Role) bool { return r == "" || r == RoleViewer || r == RoleOperator }

func (a Auth) validate() error {
	var errs []error
	for _, u := range a.Users {
		if u.Name == "" || strings.Contains(u.Name, ":") {
			errs = append(errs, fmt.Errorf("console: user name %q is empty or has a colon", u.Name))
		}
		if _, err := bcrypt.Cost([]byte(u.PasswordHash)); err != nil {
			errs = append(errs, fmt.Errorf("console: user %q: PasswordHash is not a bcrypt hash (make one with `htpasswd -nbB name password`): %w", u.Name, err))
		}
		if !validRole(u.Role) {
			errs = append(errs, fmt.Errorf("console: user %q: unknown role %q (use viewer or operator)", u.Name, u.Role))
		}
	}
	for _, t := range a.Tokens {
		if t.Name == "" {
			errs = append(errs, errors.New("console: a token has no Name (the audit trail names its holder)"))
		}
		if len(t.Token) < 16 {
			errs = append(errs, fmt.Errorf("console: token %q is shorter than 16 characters", t.Name))
		}
		if !validRole(t.Role) {
			errs = append(errs, fmt.Errorf("console: token %q: unknown role %q (use viewer or operator)", t.Name, t.Role))
		}
	}
	if a.ProxyHeader == "" && (len(a.ProxyOperators) > 0 || len(a.TrustedProxies) > 0) {
		errs = append(errs, errors.New("console: ProxyOperators or TrustedProxies set without ProxyHeader"))
	}
	return errors.Join(errs...)
}

// Identity is who made a request.
type Identity struct {
	// Name is the user, token or proxy user name; "anonymous" without
	// authentication.
	Name string
	Role Role
	// Method is how the request authenticated: "basic", "bearer", "proxy"
	// or "none".
	Method string
}

// Operator reports whether the identity may take actions.
func (i Identity) Operator() bool { return i.Role == RoleOperator }

type identityKey struct{}

// IdentityFrom returns the identity the console authenticated ctx's request as.
func IdentityFrom(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(identityKey{}).(Identity)
	return id, ok
}

var (
	errBadCredentials = errors.New("bad credentials")
	errNoCredentials  = errors.New("no credentials")
)

// authenticator checks credentials. bcrypt costs tens of milliseconds per
// check, and browsers resend basic credentials with every request, so a
// successful check is remembered under an HMAC of the credentials (keyed
// per process; the password is never kept).
type authenticator struct {
	auth    Auth
	key     []byte
	mu      sync.Mutex
	checked map[string]Identity
	dummy   []byte // a hash of the users' cost, compared for unknown names
}

const checkedMax = 1024

func newAuthenticator(a Auth) *authenticator {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	if len(a.TrustedProxies) == 0 {
		a.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	}
	au := &authenticator{auth: a, key: key, checked: map[string]Identity{}}
	if len(a.Users) > 0 {
		cost, _ := bcrypt.Cost([]byte(a.Users[0].PasswordHash))
		au.dummy, _ = bcrypt.GenerateFromPassword(key[:16], cost)
	}
	return au
}

func orViewer(r Role) Role {
	if r == "" {
		return RoleViewer
	}
	return r
}

// identify authenticates r. With no authentication configured every
// request is an anonymous viewer; otherwise a request without credentials
// fails with errNoCredentials, and one with wrong credentials with
// errBadCredentials and the identity it claimed (name and method, no role).
func (a *authenticator) identify(r *http.Request) (Identity, error) {
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, cred, _ := strings.Cut(h, " ")
		switch strings.ToLower(scheme) {
		case "basic":
			return a.basic(r)
		case "bearer":
			return a.bearer(strings.TrimSpace(cred))
		}
		return Identity{Method: strings.ToLower(scheme)}, errBadCredentials
	}
	if a.viaProxy(r) {
		if vals := r.Header.Values(a.auth.ProxyHeader); len(vals) > 0 {
			return a.proxy(vals)
		}
	}
	if !a.auth.enabled() {
		return Identity{Name: "anonymous", Role: RoleViewer, Method: "none"}, nil
	}
	return Identity{}, errNoCredentials
}

// proxy is the user a trusted proxy's header names. A header given more
// than once, or one value listing several (comma-separated, which HTTP
// takes as the same thing), is refused rather than one of them believed:
// a proxy that appends its user to a client's own header would otherwise
// let the client choose. So is a name no login could have (too long, or
// with control characters).
func (a *authenticator) proxy(vals []string) (Identity, error) {
	name := strings.TrimSpace(vals[0])
	claimed := Identity{Name: claimedName(strings.Join(vals, ", ")), Method: "proxy"}
	if len(vals) > 1 || strings.Contains(name, ",") || !validName(name) {
		return claimed, errBadCredentials
	}
	role := RoleViewer
	if slices.Contains(a.auth.ProxyOperators, name) {
		role = RoleOperator
	}
	return Identity{Name: name, Role: role, Method: "proxy"}, nil
}

// nameMax bounds the names the console believes or records: a login name
// claimed by a failed login is cut to it in the audit trail and the log.
const nameMax = 256

// validName reports whether name could be a login: not empty, at most
// nameMax bytes of UTF-8 without control characters.
func validName(name string) bool {
	return name != "" && len(name) <= nameMax && utf8.ValidString(name) && !strings.ContainsFunc(name, unicode.IsControl)
}

// claimedName is a name a failed login claimed, as the audit trail and the
// log record it: at most nameMax bytes (see bounded).
func claimedName(name string) string { return bounded(name, nameMax) }

// viaProxy reports whether r comes from a trusted proxy that a proxy
// header is configured for.
func (a *authenticator) viaProxy(r *http.Request) bool {
	return a.auth.ProxyHeader != "" && a.fromProxy(r)
}

func (a *authenticator) fromProxy(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	ip = ip.Unmap()
	return slices.ContainsFunc(a.auth.TrustedProxies, func(p netip.Prefix) bool { return p.Contains(ip) })
}

func (a *authenticator) basic(r *http.Request) (Identity, error) {
	name, pass, ok := r.BasicAuth()
	if !ok {
		return Identity{Method: "basic"}, errBadCredentials
	}
	claimed := Identity{Name: claimedName(name), Method: "basic"}
	mac := hmac.New(sha256.New, a.key)
	mac.Write([]byte(name + "\x00" + pass))
	sum := string(mac.Sum(nil))
	a.mu.Lock()
	id, hit := a.checked[sum]
	a.mu.Unlock()
	if hit {
		return id, nil
	}
	i := slices.IndexFunc(a.auth.Users, func(u User) bool { return u.Name == name })
	if i < 0 {
		// The same work as a known user, so timing does not tell names apart.
		_ = bcrypt.CompareHashAndPassword(a.dummy, []byte(pass))
		return claimed, errBadCredentials
	}
	u := a.auth.Users[i]
	if bcrypt.CompareHashAndPassword([]byte(u.PasswordHash), []byte(pass)) != nil {
		return claimed, errBadCredentials
	}
	id = Identity{Name: u.Name, Role: orViewer(u.Role), Method: "basic"}
	a.mu.Lock()
	if len(a.checked) >= checkedMax {
		clear(a.checked)
	}
	a.checked[sum] = id
	a.mu.Unlock()
	return id, nil
}

func (a *authenticator) bearer(tok string) (Identity, error) {
	want := sha256.Sum256([]byte(tok))
	for _, t := range a.auth.Tokens {
		have := sha256.Sum256([]byte(t.Token))
		if subtle.ConstantTimeCompare(want[:], have[:]) == 1 {
			return Identity{Name: t.Name, Role: orViewer(t.Role), Method: "bearer"}, nil
		}
	}
	return Identity{Method: "bearer"}, errBadCredentials
}

// csrf makes and checks the forms' tokens: an HMAC of the identity, so a
// token works only for the person it was served to. The key is
// Config.CSRFKey, or else the one kept in the database
// (pgbox_console_secret, migration 00110): every console on the database
// signs with it, so replicas behind one load balancer, and a restarted
// console, accept each other's forms.
type csrf struct {
	fixed []byte
	db    DB
	key   atomic.Pointer[[]byte]
}

// csrfSecret names the CSRF key's row in pgbox_console_secret.
const csrfSecret = "csrf"

func (c *csrf) keyFor(ctx context.Context) ([]byte, error) {
	if c.fixed != nil {
		return c.fixed, nil
	}
	if k := c.key.Load(); k != nil {
		return *k, nil
	}
	fresh := make([]byte, 32)
	_, _ = rand.Read(fresh)
	var k []byte
	if err := c.db.QueryRow(ctx, sqlSecret, csrfSecret, fresh).Scan(&k); err != nil {
		return nil, fmt.Errorf("console: read the shared CSRF key (run `relay migrate up` if pgbox_console_secret is missing): %w", err)
	}
	c.key.Store(&k)
	return k, nil
}

func (c *csrf) token(ctx context.Context, id Identity) (string, error) {
	key, err := c.keyFor(ctx)
	if err != nil {
		return "", err
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte("pgbox-console-csrf\x00" + id.Method + "\x00" + id.Name))
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil)), nil
}

func (c *csrf) valid(ctx context.Context, id Identity, tok string) (bool, error) {
	want, err := c.token(ctx, id)
	if err != nil {
		return false, err
	}
	return tok != "" && hmac.Equal([]byte(tok), []byte(want)), nil
}
