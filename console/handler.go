package console

import (
	"bytes"
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

//go:embed assets
var assets embed.FS

// Handler is the console: an http.Handler a service mounts on its own mux.
type Handler struct {
	cfg   Config
	auth  *authenticator
	csrf  *csrf
	mux   *http.ServeMux
	pages map[string]*template.Template
	cross *http.CrossOriginProtection

	rateMu   sync.Mutex
	rateLast rateSample
	// logins is shared by a fleet console's target pages: guesses spread
	// over many targets are throttled as one.
	logins *loginFailures

	// fleetName is the target this handler serves in a fleet console
	// (FleetHandler), "" otherwise; home is the fleet's prefix.
	fleetName string
	home      string
	// fleetTarget reads the target's relay state for its pages' banner.
	fleetTarget func() (FleetTarget, bool)
}

// New validates cfg and returns the console's handler.
func New(cfg Config) (*Handler, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	h := newHandler(cfg, newAuthenticator(cfg.Auth), &loginFailures{})
	h.pages = map[string]*template.Template{}
	for _, p := range []string{"overview", "parked", "parkedrow", "dead", "deadrow", "confirm", "cleanup", "story", "audit", "error", "fleet"} {
		t, err := template.New(p).Funcs(h.funcs()).ParseFS(assets, "assets/layout.html", "assets/row.html", "assets/horizon.html", "assets/"+p+".html")
		if err != nil {
			return nil, err
		}
		h.pages[p] = t
	}
	h.routes()
	return h, nil
}

// newHandler returns a handler of cfg (with its defaults) without its
// pages and routes; a fleet console's target handlers share the fleet's
// authentication, login throttle and parsed pages (whose functions read
// only HidePayloads, the same for every target).
func newHandler(cfg Config, auth *authenticator, logins *loginFailures) *Handler {
	h := &Handler{cfg: cfg, auth: auth, logins: logins, csrf: &csrf{fixed: cfg.CSRFKey, db: cfg.DB}, mux: http.NewServeMux(),
		cross: http.NewCrossOriginProtection()}
	h.cross.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.fail(w, r, http.StatusForbidden, "cross-origin request refused")
	}))
	return h
}

func (h *Handler) routes() {
	h.mux.Handle("GET /static/", staticFiles())
	h.mux.HandleFunc("GET /{$}", h.overview)
	h.mux.HandleFunc("GET /parked", h.parked)
	h.mux.HandleFunc("GET /parked/row", h.parkedRow)
	h.mux.HandleFunc("GET /parked/confirm", h.parkedConfirm)
	h.mux.HandleFunc("POST /parked/retry", h.action("parked.retry", h.parkedAct))
	h.mux.HandleFunc("POST /parked/discard", h.action("parked.discard", h.parkedAct))
	h.mux.HandleFunc("GET /dead", h.dead)
	h.mux.HandleFunc("GET /dead/row", h.deadRow)
	h.mux.HandleFunc("GET /dead/confirm", h.deadConfirm)
	h.mux.HandleFunc("POST /dead/replay", h.action("dead.replay", h.deadReplay))
	h.mux.HandleFunc("GET /cleanup", h.cleanupPage)
	h.mux.HandleFunc("GET /story", h.story)
	h.mux.HandleFunc("GET /audit", h.auditPage)
}

// staticFiles serves the console's stylesheet and images at /static/.
func staticFiles() http.Handler {
	static, _ := fs.Sub(assets, "assets/static")
	return http.StripPrefix("/static/", http.FileServerFS(static))
}

// ServeHTTP serves the console. Every response carries the security
// headers; every request is authenticated first.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	securityHeaders(w)
	path, ok := stripPrefix(w, r, h.cfg.Prefix)
	if !ok {
		return
	}
	id, ok := h.login(w, r)
	if !ok {
		return
	}
	h.serveAs(w, r, id, path)
}

// serveAs serves r, authenticated as id, at path (the request's path
// without the prefix).
func (h *Handler) serveAs(w http.ResponseWriter, r *http.Request, id Identity, path string) {
	r2 := r.Clone(context.WithValue(r.Context(), identityKey{}, id))
	r2.URL.Path = path
	r2.URL.RawPath = ""
	h.mux.ServeHTTP(w, r2)
}

// securityHeaders are on every response of the console.
func securityHeaders(w http.ResponseWriter) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	// Pages show payloads, errors and operator data: never cached.
	hd.Set("Cache-Control", "no-store")
}

// stripPrefix returns r's path without prefix, or answers r (404 outside
// the prefix, a redirect from the bare prefix to prefix/) and returns false.
func stripPrefix(w http.ResponseWriter, r *http.Request, prefix string) (string, bool) {
	path := r.URL.Path
	if prefix != "" {
		if path != prefix && !strings.HasPrefix(path, prefix+"/") {
			http.NotFound(w, r)
			return "", false
		}
		path = strings.TrimPrefix(path, prefix)
	}
	if path == "" {
		http.Redirect(w, r, prefix+"/", http.StatusSeeOther)
		return "", false
	}
	return path, true
}

// login authenticates r, or answers it: 401 without or with wrong
// credentials, 429 while the claimed user or the source address waits after
// repeated failures (loginKeys). A failed login is logged and audited
// (action "login", the claimed name and method, the source address); a
// successful basic login clears its user's count, never its address's:
// one account's logins must not wipe the failures of guesses at others.
func (h *Handler) login(w http.ResponseWriter, r *http.Request) (Identity, bool) {
	now := time.Now()
	keys := h.loginKeys(r)
	if wait := h.logins.wait(now, keys); wait > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(wait.Round(time.Second)/time.Second)+1))
		http.Error(w, "too many failed logins: try again later", http.StatusTooManyRequests)
		return Identity{}, false
	}
	id, err := h.auth.identify(r)
	if err == nil {
		if id.Method == "basic" {
			h.logins.succeed(userKey(id.Name))
		}
		return id, true
	}
	if errors.Is(err, errBadCredentials) {
		src, path := sourceAddr(r), bounded(r.URL.Path, targetValueMax)
		throttled := h.logins.fail(now, keys)
		h.cfg.Logger.WarnContext(r.Context(), "console login failed", "user", id.Name, "auth", id.Method, "source", src,
			"method", r.Method, "path", path, "throttled", throttled)
		h.refused(r.Context(), id, "login", fmt.Sprintf("source=%q method=%q path=%q", src, bounded(r.Method, nameMax), path), "wrong credentials")
	}
	if len(h.cfg.Auth.Users) > 0 {
		w.Header().Set("WWW-Authenticate", `Basic realm="pgbox console", charset="UTF-8"`)
	}
	http.Error(w, "authentication required", http.StatusUnauthorized)
	return Identity{}, false
}

// action wraps a POST action: a same-origin request, the operator role, a
// valid CSRF token; refusals are logged and role refusals audited.
//
// The role is checked before the token: viewer pages carry no action form,
// so a viewer's POST never has a token, and checking the token first would
// leave every viewer's attempt out of the audit. A non-operator's POST can
// do nothing whatever its token, so it is audited as a role refusal, noting
// when it came without a valid token (not from the console's page, or
// forged). A cross-origin POST is refused before either, unaudited: it
// names nobody reliably.
func (h *Handler) action(name string, act func(w http.ResponseWriter, r *http.Request, who Identity, name string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		who, _ := IdentityFrom(r.Context())
		if err := h.cross.Check(r); err != nil {
			h.cfg.Logger.WarnContext(r.Context(), "console action refused", "actor", who.Name, "action", name, "reason", err.Error())
			h.fail(w, r, http.StatusForbidden, "cross-origin request refused")
			return
		}
		// The confirmed ids ride in the form: room for MaxActionRows of them.
		r.Body = http.MaxBytesReader(w, r.Body, int64(64<<10+20*h.cfg.MaxActionRows))
		if err := r.ParseForm(); err != nil {
			h.fail(w, r, http.StatusBadRequest, "unreadable form: "+err.Error())
			return
		}
		ok, err := h.csrf.valid(r.Context(), who, r.PostForm.Get("csrf"))
		if !who.Operator() {
			why := "needs the operator role"
			if !ok && err == nil {
				why += " (sent without a valid CSRF token)"
			}
			h.refused(r.Context(), who, name, h.target(r.PostForm), why)
			h.fail(w, r, http.StatusForbidden, "this action needs the operator role ("+who.Name+" is a "+string(who.Role)+")")
			return
		}
		if err != nil {
			h.failErr(w, r, err)
			return
		}
		if !ok {
			h.cfg.Logger.WarnContext(r.Context(), "console action refused", "actor", who.Name, "action", name, "reason", "missing or wrong CSRF token")
			h.fail(w, r, http.StatusForbidden, "missing or wrong CSRF token: reload the page and try again")
			return
		}
		act(w, r, who, name)
	}
}

// ctx bounds a page's or an action's database work.
func (h *Handler) ctx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), h.cfg.QueryTimeout)
}

// page is what every template gets.
type page struct {
	Title  string
	Nav    string
	Prefix string
	Who    Identity
	CSRF   string
	// Hide is set when payloads are not to be shown.
	Hide  bool
	Flash *AuditRecord
	Data  any
	Took  time.Duration
	// Target is the target a fleet console's page is of ("" outside a
	// fleet console); Home is the fleet overview's prefix. Fleet is set on
	// the fleet overview itself.
	Target string
	Home   string
	Fleet  bool
	// TargetState is the relay's state of Target in this process (nil:
	// not listed any more).
	TargetState *FleetTarget
}

func (h *Handler) render(w http.ResponseWriter, r *http.Request, name, title string, data any, start time.Time) {
	who, _ := IdentityFrom(r.Context())
	tok, err := h.csrf.token(r.Context(), who)
	if err != nil {
		// The page still shows; its forms are refused until the key is readable.
		h.cfg.Logger.ErrorContext(r.Context(), "console: page served without a CSRF token", "page", name, "err", err)
	}
	p := page{Title: title, Nav: name, Prefix: h.cfg.Prefix, Who: who, CSRF: tok, Hide: h.cfg.HidePayloads, Data: data,
		Took: time.Since(start).Round(time.Millisecond), Target: h.fleetName, Home: h.home, Fleet: h.fleetName == "" && h.home != ""}
	p.TargetState = h.targetState()
	if done := r.URL.Query().Get("done"); done != "" && h.cfg.DB != nil {
		ctx, cancel := h.ctx(r)
		defer cancel()
		if id, ok := parseID(done); ok {
			p.Flash, _ = readAuditOne(ctx, h.cfg.DB, id)
		}
		if p.Flash != nil && !ownFlash(p.Flash, who, name) {
			p.Flash = nil
		}
	}
	var buf bytes.Buffer
	if err := h.pages[name].ExecuteTemplate(&buf, "layout", p); err != nil {
		h.cfg.Logger.ErrorContext(r.Context(), "console: render page", "page", name, "err", err)
		http.Error(w, "cannot render the page", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write(buf.Bytes())
}

// targetState is the relay's state of a fleet console's target, for its
// pages' banner (nil outside a fleet console, or when no longer listed).
func (h *Handler) targetState() *FleetTarget {
	if h.fleetTarget == nil {
		return nil
	}
	if t, ok := h.fleetTarget(); ok {
		return &t
	}
	return nil
}

// ownFlash reports whether rec may be shown as the flash of page to who:
// only the outcome of who's own action (same name, same way of
// authenticating) on that page's rows. Any audit id can be put in a link's
// "done", and a failed login records a name its sender chose: shown to
// someone else as the console's own banner, it would speak for the console.
func ownFlash(rec *AuditRecord, who Identity, page string) bool {
	return rec.Actor == who.Name && rec.Method == who.Method && strings.HasPrefix(rec.Action, page+".")
}

// fail renders an error page with status.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	who, _ := IdentityFrom(r.Context())
	var buf bytes.Buffer
	p := page{Title: http.StatusText(status), Prefix: h.cfg.Prefix, Who: who, Data: msg, Target: h.fleetName, Home: h.home, Fleet: h.fleetName == "" && h.home != "",
		TargetState: h.targetState()}
	if err := h.pages["error"].ExecuteTemplate(&buf, "layout", p); err != nil {
		http.Error(w, msg, status)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// failErr shows err: a bad parameter as a 400 (or its status) naming it; anything else is
// logged and a 500 (errors name what failed; no secret is in them: the DSN
// never reaches an inspect error).
func (h *Handler) failErr(w http.ResponseWriter, r *http.Request, err error) {
	var bad *badParam
	if errors.As(err, &bad) {
		h.fail(w, r, cmp.Or(bad.status, http.StatusBadRequest), bad.Error())
		return
	}
	h.cfg.Logger.ErrorContext(r.Context(), "console: page failed", "path", r.URL.Path, "err", err)
	h.fail(w, r, http.StatusInternalServerError, err.Error())
}
