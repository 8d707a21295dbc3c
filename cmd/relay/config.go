package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pgbox/pgbox/cleanup"
	"github.com/pgbox/pgbox/internal/dbconf"
)

// errUsage marks errors that exit with code 2: a bad flag, environment
// variable or argument. The message has already named the setting.
var errUsage = errors.New("usage error")

// usageError wraps a message so that main exits with code 2.
func usageError(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errUsage, fmt.Sprintf(format, args...))
}

// setting is one configuration knob: a flag, the environment variable that
// sets it when the flag is absent, and a default used when neither is given.
// Precedence is flag > environment > default.
type setting struct {
	name   string // flag name, without dashes
	env    string // environment variable
	def    string // default, as text
	usage  string
	allow  string // what values are allowed, for errors and --help
	secret bool   // never printed
	dsn    bool   // printed with its password redacted
	set    func(string) error
	group  string
}

// settings is an ordered set of settings bound to a flag.FlagSet.
type settings struct {
	list []*setting
	// source records where each value came from ("flag" or "env"); values
	// the raw text given.
	source map[string]string
	values map[string]string
	// flagErr is the last flag error, already naming the setting (the flag
	// package's own message would print a secret value).
	flagErr error
}

func newSettings() *settings {
	return &settings{source: map[string]string{}, values: map[string]string{}}
}

// value adds a setting whose text parse turns into a T; allow says what it
// accepts (for errors and --help).
func value[T any](s *settings, p *T, group, name, env, def, usage, allow string, parse func(string) (T, bool)) *setting {
	st := &setting{name: name, env: env, def: def, usage: usage, group: group, allow: allow}
	st.set = func(v string) error {
		x, ok := parse(v)
		if !ok {
			return errors.New("must be " + allow)
		}
		*p = x
		return nil
	}
	s.list = append(s.list, st)
	return st
}

func (s *settings) str(p *string, group, name, env, def, usage string) *setting {
	return value(s, p, group, name, env, def, usage, "any text", func(v string) (string, bool) { return v, true })
}

func (s *settings) enum(p *string, group, name, env, def, usage string, allowed ...string) *setting {
	return value(s, p, group, name, env, def, usage, "one of "+strings.Join(quoteAll(allowed), ", "), func(v string) (string, bool) {
		for _, a := range allowed {
			if strings.EqualFold(strings.TrimSpace(v), a) {
				return a, true
			}
		}
		return "", false
	})
}

func (s *settings) integer(p *int, group, name, env string, def, min, max int, usage string) *setting {
	return value(s, p, group, name, env, strconv.Itoa(def), usage, fmt.Sprintf("an integer from %d to %d", min, max), func(v string) (int, bool) {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		return n, err == nil && n >= min && n <= max
	})
}

func (s *settings) duration(p *time.Duration, group, name, env string, def, min time.Duration, usage string) *setting {
	allow := fmt.Sprintf("a duration of at least %v, like 500ms, 30s or 2h", min)
	if min == 0 {
		allow = "a duration like 500ms, 30s or 2h (0 allowed)"
	}
	return value(s, p, group, name, env, fmtDuration(def), usage, allow, func(v string) (time.Duration, bool) {
		d, err := time.ParseDuration(strings.TrimSpace(v))
		return d, err == nil && d >= min
	})
}

// retention is a positive duration or "forever" (cleanup.Forever).
func (s *settings) retention(p *time.Duration, group, name, env string, def time.Duration, usage string) *setting {
	show := "forever"
	if def > 0 {
		show = fmtDuration(def)
	}
	return value(s, p, group, name, env, show, usage, `a positive duration like 168h, or "forever"`, func(v string) (time.Duration, bool) {
		if v = strings.TrimSpace(v); strings.EqualFold(v, "forever") {
			return cleanup.Forever, true
		}
		d, err := time.ParseDuration(v)
		return d, err == nil && d > 0
	})
}

func (s *settings) boolean(p *bool, group, name, env string, def bool, usage string) *setting {
	return value(s, p, group, name, env, strconv.FormatBool(def), usage, "true or false", func(v string) (bool, bool) {
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		return b, err == nil
	})
}

func (s *settings) csv(p *[]string, group, name, env, def, usage string) *setting {
	return value(s, p, group, name, env, def, usage, "a comma-separated list", func(v string) ([]string, bool) { return splitList(v), true })
}

func splitList(v string) []string {
	var out []string
	for _, part := range strings.Split(v, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = strconv.Quote(s)
	}
	return out
}

// flagValue adapts a setting to flag.Value.
type flagValue struct {
	st *setting
	s  *settings
}

func (f flagValue) String() string {
	if f.st == nil {
		return ""
	}
	return f.st.def
}

func (f flagValue) Set(v string) error {
	if err := f.st.set(v); err != nil {
		f.s.flagErr = fmt.Errorf("invalid value %s for --%s (env %s): %v", f.s.quoted(f.st, v), f.st.name, f.st.env, err)
		return f.s.flagErr
	}
	f.s.source[f.st.name] = "flag"
	f.s.values[f.st.name] = v
	return nil
}

func (f flagValue) IsBoolFlag() bool { return f.st.allow == "true or false" }

// parse applies defaults, then flags, then the environment for settings no flag
// set; a variable set to the empty string sets the empty value. It returns the positional arguments. Flags and positional arguments may
// be interleaved (`migrate up --database-url ...`). Every error wraps errUsage.
func (s *settings) parse(cmd string, args []string, lookupEnv func(string) (string, bool), out io.Writer) ([]string, error) {
	for _, st := range s.list {
		if err := st.set(st.def); err != nil {
			panic(fmt.Sprintf("default %q of --%s: %v", st.def, st.name, err))
		}
	}
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	for _, st := range s.list {
		fs.Var(flagValue{st: st, s: s}, st.name, st.usage)
	}
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				s.usage(out, cmd)
				return nil, flag.ErrHelp
			}
			if s.flagErr != nil {
				err = s.flagErr
			}
			return nil, usageError("%s: %v (run `relay %s --help` for the settings)", cmd, err, cmd)
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		if args[0] == "--" {
			pos = append(pos, args[1:]...)
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	for _, st := range s.list {
		if s.source[st.name] == "flag" || st.env == "" {
			continue
		}
		v, ok := lookupEnv(st.env) // set but empty is a value: PGBOX_HTTP_ADDR= turns HTTP off
		if !ok {
			continue
		}
		if err := st.set(v); err != nil {
			return nil, usageError("invalid value %s for %s (--%s): %v", s.quoted(st, v), st.env, st.name, err)
		}
		s.source[st.name] = "env"
		s.values[st.name] = v
	}
	return pos, nil
}

func (s *settings) quoted(st *setting, v string) string {
	if st.secret {
		return `"(redacted)"`
	}
	if st.dsn {
		return strconv.Quote(dbconf.RedactDSN(v))
	}
	return strconv.Quote(v)
}

// usage prints every setting of the command with its environment variable and
// default.
func (s *settings) usage(out io.Writer, cmd string) {
	c := findCommand(cmd)
	fmt.Fprintf(out, "Usage: relay %s [flags]\n\n%s\n\n", c.synopsis, c.doc)
	fmt.Fprintln(out, "Each flag may also be set by its environment variable; a flag wins over the environment.")
	printSettings(out, s.list)
}

func printSettings(out io.Writer, list []*setting) {
	groups := []string{}
	seen := map[string]bool{}
	for _, st := range list {
		if !seen[st.group] {
			seen[st.group] = true
			groups = append(groups, st.group)
		}
	}
	for _, g := range groups {
		fmt.Fprintf(out, "\n%s:\n", g)
		tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		for _, st := range list {
			if st.group != g {
				continue
			}
			def := st.def
			if def == "" {
				def = `""`
			}
			fmt.Fprintf(tw, "  --%s\t%s\tdefault %s\t%s\n", st.name, st.env, def, st.help())
		}
		_ = tw.Flush()
	}
}

// help is the setting's description as --help prints it (and
// docs/operations.md repeats it, checked by TestDocsListEverySetting).
func (st *setting) help() string {
	if strings.HasPrefix(st.allow, "one of") {
		return st.usage + " (" + st.allow + ")"
	}
	return st.usage
}

// redacted returns every setting's effective value as printable text, with
// secrets removed and passwords in DSNs masked.
func (s *settings) redacted() map[string]string {
	out := map[string]string{}
	for _, st := range s.list {
		v, ok := s.values[st.name]
		if !ok {
			v = st.def
		}
		switch {
		case st.secret && v != "":
			v = "(redacted)"
		case st.dsn:
			v = dbconf.RedactDSN(v)
		}
		out[st.name] = v
	}
	return out
}

// fmtDuration prints 1h instead of 1h0m0s.
func fmtDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
