package report

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"unicode/utf8"

	"github.com/kcheck-dev/kcheck/internal/bounded"
	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/printable"
)

// Load reads saved results into one bundle: report.json files (a whole
// bundle each), and streams of JSON objects as `kcheck check --json` and
// `kcheck run --json` print them (one result a line), or as `kcheck
// diagnose --json` prints (an object with "steps"). Items keep their file
// order. The environment is the one recorded in the first report.json, or
// this process's when none is read.
func Load(paths ...string) (Bundle, error) {
	return LoadContext(context.Background(), bounded.Limit{}, paths...)
}

// LoadContext is Load under ctx (a named pipe with no writer, a stalled
// one), reading at most limit bytes of all the files together (/dev/zero,
// a JSON string that never ends).
func LoadContext(ctx context.Context, limit bounded.Limit, paths ...string) (Bundle, error) {
	var b Bundle
	haveEnv := false
	for _, p := range paths {
		data, err := bounded.ReadFile(ctx, p, limit)
		if err != nil {
			return b, err
		}
		limit = limit.Less(int64(len(data)))
		dec := json.NewDecoder(bytes.NewReader(data))
		for n := 1; ; n++ {
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				return b, fmt.Errorf("%s: object %d: %v", p, n, err)
			}
			var keys map[string]json.RawMessage
			if err := json.Unmarshal(raw, &keys); err != nil {
				return b, fmt.Errorf("%s: object %d is not a JSON object: %v", p, n, err)
			}
			switch {
			case keys["kcheck_report"] != nil:
				var sub Bundle
				if err := json.Unmarshal(raw, &sub); err != nil {
					return b, fmt.Errorf("%s: report %d: %v", p, n, err)
				}
				if sub.Format != Format {
					return b, fmt.Errorf("%s: kcheck_report = %d: this kcheck reads format %d", p, sub.Format, Format)
				}
				if err := sub.check(); err != nil {
					return b, fmt.Errorf("%s: report %d: %v", p, n, err)
				}
				if !haveEnv {
					b.Environment, b.Command, b.Title, haveEnv = sub.Environment, sub.Command, sub.Title, true
				}
				b.Items = append(b.Items, sub.Items...)
				if sub.Diagnosis != nil {
					if b.Diagnosis != nil {
						return b, fmt.Errorf("%s: a second diagnosis: a report holds one", p)
					}
					b.Diagnosis = sub.Diagnosis
				}
			case keys["steps"] != nil:
				var d Diagnosis
				if err := json.Unmarshal(raw, &d); err != nil {
					return b, fmt.Errorf("%s: diagnosis %d: %v", p, n, err)
				}
				if err := d.check(); err != nil {
					return b, fmt.Errorf("%s: diagnosis %d: %v", p, n, err)
				}
				if b.Diagnosis != nil {
					return b, fmt.Errorf("%s: a second diagnosis: a report holds one", p)
				}
				b.Diagnosis = &d
				// A diagnosis of a capture carries its check result too.
				if keys["checks"] != nil && keys["file"] != nil {
					var r check.Result
					if err := json.Unmarshal(raw, &r); err == nil {
						if err := (&Item{Result: r}).check(); err != nil {
							return b, fmt.Errorf("%s: diagnosis %d: %v", p, n, err)
						}
						b.Items = append(b.Items, Item{Result: r, Reproduce: "kcheck diagnose " + r.File})
					}
				}
			case keys["verdict"] != nil && (keys["checks"] != nil || keys["file"] != nil):
				var r check.Result
				if err := json.Unmarshal(raw, &r); err != nil {
					return b, fmt.Errorf("%s: result %d: %v", p, n, err)
				}
				if err := (&Item{Result: r}).check(); err != nil {
					return b, fmt.Errorf("%s: result %d: %v", p, n, err)
				}
				b.Items = append(b.Items, Item{Result: r, Reproduce: reproduceFor(r)})
			default:
				return b, fmt.Errorf("%s: object %d is neither a check result (file, verdict, checks), a diagnosis (steps) nor a report (kcheck_report)", p, n)
			}
		}
	}
	if !haveEnv {
		b.Environment = CurrentEnvironment()
	}
	b.Format = Format
	if len(b.Items) == 0 && b.Diagnosis == nil {
		return b, errors.New("no result to report: the files hold no check result, diagnosis or report")
	}
	return b, nil
}

// reproduceFor guesses the command behind a bare result: a file that
// exists is re-checked; a run's result is named after its case.
func reproduceFor(r check.Result) string {
	if r.File == "" {
		return ""
	}
	if _, err := os.Stat(r.File); err == nil {
		return "kcheck check " + ShellQuote(r.File)
	}
	if backend, ok := r.Provenance["kcheck.backend"]; ok {
		return fmt.Sprintf("kcheck run --case %s --backend %s", ShellQuote(r.File), ShellQuote(backend))
	}
	return ""
}

// ShellQuote quotes s for a POSIX shell when it needs it (the reproduction
// commands the command line builds): '...' as a rule,
// and $'...' (POSIX.1-2024; bash, zsh, ksh, busybox) with \xHH escapes when s
// holds a byte a terminal would act on, so that a reproduction command stays
// one printable line that the shell reads back to the same bytes.
func ShellQuote(s string) string {
	if printable.Escape(s) != s {
		var b strings.Builder
		b.WriteString("$'")
		for i := 0; i < len(s); {
			r, n := utf8.DecodeRuneInString(s[i:])
			switch {
			case r == '\\' || r == '\'':
				b.WriteByte('\\')
				b.WriteRune(r)
			case (r != utf8.RuneError || n > 1) && printable.Escape(string(r)) == string(r):
				b.WriteString(s[i : i+n])
			default:
				for _, c := range []byte(s[i : i+n]) {
					fmt.Fprintf(&b, `\x%02x`, c)
				}
			}
			i += n
		}
		return b.String() + "'"
	}
	safe := s != ""
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '/' || c == '.' || c == '_' || c == '-' || c == ':' || c == '=' || c == ',' || c == '+') {
			safe = false
			break
		}
	}
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
