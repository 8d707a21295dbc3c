package console

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html/template"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/pgbox/pgbox/outbox"
)

func ageText(sec float64) string {
	d := time.Duration(sec * float64(time.Second))
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	case d < 48*time.Hour:
		return d.Round(time.Minute).String()
	}
	return fmt.Sprintf("%.1fd", d.Hours()/24)
}

// countText shows a count with thousands separators; "~" marks a planner
// estimate.
func countText(n int64, estimated bool) string {
	if estimated {
		return "~" + thousands(n)
	}
	return thousands(n)
}

// cappedText shows a count that stopped at a limit as a lower bound
// ("≥ 1,000"), as `relay status` does.
func cappedText(n int64, capped bool) string {
	if capped {
		return "≥ " + thousands(n)
	}
	return thousands(n)
}

func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// bidi are the Unicode controls that reorder or hide the text around them
// (embeddings, overrides, isolates, marks): shown escaped, so a key, an
// error or a name cannot make the page read differently from what it holds.
func bidi(r rune) bool {
	switch {
	case r == '\u061c', r == '\u200e', r == '\u200f':
		return true
	case r >= '\u202a' && r <= '\u202e', r >= '\u2066' && r <= '\u2069':
		return true
	}
	return false
}

// vis shows s with every bidi control escaped as \uXXXX.
func vis(s string) string {
	if !strings.ContainsFunc(s, bidi) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if bidi(r) {
			fmt.Fprintf(&b, "\\u%04X", r)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// inboxErrRe reads the error text the inbox records for a dead letter
// (inbox.MessageError): consumer, message position, the optional key, and
// the cause; "handler: " starts a handler's own error.
var inboxErrRe = regexp.MustCompile(`(?s)^inbox: consumer ("(?:[^"\\]|\\.)*"), message (\S+?)(, key "(?:[^"\\]|\\.)*")?: (.*)$`)

// quotedRe matches a Go-quoted string (%q), the form pgbox's errors give
// keys and header values in.
var quotedRe = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)

// errText shows an error text: a handler's own error first, pgbox's
// context (consumer, message, key) after it. With HidePayloads the
// handler's text (which may carry a card number) and every quoted value (a
// key, a header) are hidden; pgbox's context without the key stays.
func (h *Handler) errText(s string) string {
	m := inboxErrRe.FindStringSubmatch(s)
	hide := h.cfg.HidePayloads
	if m == nil {
		if hide {
			return vis(quotedRe.ReplaceAllString(s, `"(hidden)"`))
		}
		return vis(s)
	}
	where := "inbox: consumer " + m[1] + ", message " + m[2]
	cause, handler := strings.CutPrefix(m[4], "handler: ")
	switch {
	case hide && handler:
		return vis(fmt.Sprintf("handler error (%d characters, hidden) — %s", utf8.RuneCountInString(cause), where))
	case hide:
		return vis(quotedRe.ReplaceAllString(cause, `"(hidden)"`) + " — " + where)
	case handler:
		return vis(cause + " — handler, " + where + m[3])
	}
	return vis(cause + " — " + where + m[3])
}

// payload is a byte string shown three ways.
type payload struct {
	Nil    bool
	Size   int
	Text   string // "" when not printable UTF-8
	JSON   string // indented, "" when not JSON
	Hex    string
	Hidden bool
}

func printable(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if !unicode.IsPrint(r) && !unicode.IsSpace(r) {
			return false
		}
	}
	return true
}

func (h *Handler) payload(b []byte) payload {
	p := payload{Nil: b == nil, Size: len(b), Hidden: h.cfg.HidePayloads}
	if p.Hidden || b == nil {
		return p
	}
	if printable(b) {
		p.Text = string(b)
	}
	var buf bytes.Buffer
	if json.Valid(b) && json.Indent(&buf, b, "", "  ") == nil {
		p.JSON = buf.String()
	}
	if len(b) > 4096 {
		p.Hex = hex.Dump(b[:4096]) + "…"
	} else {
		p.Hex = hex.Dump(b)
	}
	return p
}

// keyText shows a key for a list: its text, or hex, or hidden.
func (h *Handler) keyText(b []byte) string {
	switch {
	case h.cfg.HidePayloads:
		return "(hidden)"
	case b == nil:
		return "(no key)"
	case printable(b):
		return vis(string(b))
	}
	return "0x" + hex.EncodeToString(b)
}

func (h *Handler) funcs() template.FuncMap {
	return template.FuncMap{
		"age": func(s any) string {
			switch v := s.(type) {
			case float64:
				return ageText(v)
			case *float64:
				if v == nil {
					return "–"
				}
				return ageText(*v)
			case time.Duration:
				return ageText(v.Seconds())
			}
			return fmt.Sprint(s)
		},
		"since": func(now, t time.Time) string { return ageText(now.Sub(t).Seconds()) },
		"ago": func(t time.Time) string {
			if t.IsZero() {
				return "never"
			}
			return ageText(time.Since(t).Seconds()) + " ago"
		},
		"count":  countText,
		"capped": cappedText,
		"vis":    vis,
		// quote shows text someone chose, not the console, as a quoted
		// string: control and bidi characters escaped.
		"quote":   strconv.Quote,
		"err":     h.errText,
		"neg":     func(f *float64) bool { return f != nil && *f < 0 },
		"int64":   func(n int) int64 { return int64(n) },
		"ts":      func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") },
		"payload": h.payload,
		"key":     h.keyText,
		"header": func(hd outbox.Header) string {
			if h.cfg.HidePayloads {
				return "(hidden)"
			}
			return h.keyText(hd.Value)
		},
		"q": func(kv ...string) template.URL {
			v := url.Values{}
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i+1] != "" {
					v.Set(kv[i], kv[i+1])
				}
			}
			return template.URL(v.Encode())
		},
		"deref": func(s *string) string {
			if s == nil {
				return ""
			}
			return *s
		},
		"trunc": func(s string, n int) string {
			if utf8.RuneCountInString(s) <= n {
				return s
			}
			return string([]rune(s)[:n-1]) + "…"
		},
		"join": joinIDs,
		"rows": rowsText,
	}
}
