package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"

	"github.com/spf13/cobra"

	"github.com/kcheck-dev/kcheck/internal/bounded"
	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/compare"
)

func init() { extraCommands = append(extraCommands, newMergeCmd) }

type source struct {
	name string
	r    io.Reader
}

// mergeResults reads the JSON objects `check --json` and `run --json`
// print from each reader, in order, naming the source of any bad line;
// all the sources together may hold limit bytes (a JSON string that never
// ends would be buffered whole by the decoder).
func mergeResults(sources []source, limit bounded.Limit) ([]check.Result, error) {
	var all []check.Result
	for _, src := range sources {
		name := src.name
		in := bounded.Reader(src.r, name, limit)
		dec := json.NewDecoder(in)
		for i := 1; dec.More(); i++ {
			var r check.Result
			if err := dec.Decode(&r); err != nil {
				if errors.Is(err, bounded.ErrTooLarge) || errors.Is(err, bounded.ErrTimeout) || errors.Is(err, context.Canceled) {
					return nil, err // it names the source
				}
				return nil, fmt.Errorf("%s: object %d: %v", name, i, err)
			}
			if r.File == "" || r.Verdict == "" {
				return nil, fmt.Errorf("%s: object %d is not a kcheck result (no file or verdict)", name, i)
			}
			all = append(all, r)
		}
		// More says false at the end, but also when a read failed or
		// a stray '}' or ']' follows: only a clean end is the end.
		var extra json.RawMessage
		if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
			if errors.Is(err, bounded.ErrTooLarge) || errors.Is(err, bounded.ErrTimeout) || errors.Is(err, context.Canceled) {
				return nil, err
			}
			return nil, fmt.Errorf("%s: after the last result: %v", name, err)
		}
		limit = limit.Less(in.Count())
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].File < all[j].File })
	for i := 1; i < len(all); i++ {
		if all[i].File == all[i-1].File {
			return nil, fmt.Errorf("result for %s appears twice (overlapping shards?)", all[i].File)
		}
	}
	return all, nil
}

func newMergeCmd(s *IO) *cobra.Command {
	var bisect bool
	var in inputBounds
	cmd := &cobra.Command{
		Use:   "merge RESULTS.json...",
		Short: "Combine the JSON results of sharded runs into one",
		Long: `merge reads the JSON objects that 'check --json' and 'run --json' print
(one file per shard), refuses duplicates, prints them as one sorted stream on
stdout and a tally on stderr, and exits as a single run over all of them would.`,
		Example: `  kcheck merge shard-*.json > all.json`,
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, limit, cancel, err := in.reading(cmd.Context())
			if err != nil {
				return exitWith(s, ExitUsage, bisect, err)
			}
			defer cancel()
			var sources []source
			for _, a := range args {
				f, err := bounded.Open(ctx, a)
				if err != nil {
					return exitWith(s, ExitUsage, bisect, err)
				}
				defer f.Close()
				sources = append(sources, source{a, f})
			}
			all, err := mergeResults(sources, limit)
			if err != nil {
				return exitWith(s, ExitUsage, bisect, err)
			}
			enc := json.NewEncoder(s.Out)
			tally := map[compare.Verdict]int{}
			code := ExitPass
			for _, r := range all {
				if err := enc.Encode(r); err != nil {
					return err
				}
				tally[r.Verdict]++
				code = worseExit(code, exitForVerdict(r.Verdict, bisect))
			}
			fmt.Fprintf(s.Err, "%d results: %d pass, %d fail, %d inconclusive, %d error\n",
				len(all), tally["pass"], tally["fail"], tally["inconclusive"], tally["error"])
			return exitCode(code)
		},
	}
	cmd.Flags().BoolVar(&bisect, "bisect", false, "exit 125 (git bisect skip) for inconclusive results and unusable input")
	in.addFlags(cmd.Flags())
	return cmd
}
