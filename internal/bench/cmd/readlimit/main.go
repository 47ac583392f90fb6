// Command readlimit measures the single-core read limit of files: each is
// mapped read-only, faulted in and summed byte by byte on one goroutine
// (bench.SumFile), the least work that any check of every byte of the file
// does. It prints one JSON line a file: the bytes, their sum (a checksum
// that shows every byte was read), the seconds from the open to the sum and
// the rate.
//
//	readlimit FILE...
//
// make bench times it beside `kcheck check` and the numpy check on the same
// page-cached capture. It is Go, not numpy, because numpy's uint8 sum widens
// every byte (1-2 GB/s) and would understate the limit.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/kcheck-dev/kcheck/internal/bench"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// result is what readlimit prints for one file.
type result struct {
	File    string  `json:"file"`
	Bytes   int64   `json:"bytes"`
	Sum     uint64  `json:"sum"` // the sum of every byte, mod 2^64
	Seconds float64 `json:"seconds"`
	GBps    float64 `json:"gb_per_s"`
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: readlimit FILE...")
		return 2
	}
	enc := json.NewEncoder(stdout)
	for _, path := range args {
		start := time.Now()
		n, sum, err := bench.SumFile(path)
		if err != nil {
			fmt.Fprintf(stderr, "readlimit: %v\n", err)
			return 1
		}
		r := result{File: path, Bytes: n, Sum: sum, Seconds: time.Since(start).Seconds()}
		if r.Seconds > 0 {
			r.GBps = float64(n) / r.Seconds / 1e9
		}
		enc.Encode(r)
	}
	return 0
}
