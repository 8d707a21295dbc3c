package console

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html/template"
	"net/url"
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

func countText(n int64, estimated bool) string {
	if estimated {
		return "~" + strconv.FormatInt(n, 10)
	}
	return strconv.FormatInt(n, 10)
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
		return string(b)
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
		"count":   countText,
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
		"join": func(ids []int64) string {
			var b strings.Builder
			for i, id := range ids {
				if i > 0 {
					b.WriteString(",")
				}
				b.WriteString(strconv.FormatInt(id, 10))
			}
			return b.String()
		},
	}
}

func parseID(s string) (int64, bool) {
	id, err := strconv.ParseInt(s, 10, 64)
	return id, err == nil && id > 0
}

// parseIDs reads a comma-separated id list ("" is none).
func parseIDs(s string) ([]int64, error) {
	var ids []int64
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		id, ok := parseID(f)
		if !ok {
			return nil, fmt.Errorf("%q is not a row id", f)
		}
		ids = append(ids, id)
	}
	return ids, nil
}
