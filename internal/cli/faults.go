package cli

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kcheck-dev/kcheck/internal/faults"
)

func init() { extraCommands = append(extraCommands, newFaultsCmd) }

func newFaultsCmd(s *IO) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "faults",
		Short: "List the planted-fault catalog (usable as --backend faulty:NAME)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			all := faults.All()
			if asJSON {
				type row struct {
					Name     string   `json:"name"`
					Stage    string   `json:"stage"`
					BugClass string   `json:"bug_class"`
					Kernels  []string `json:"kernels"`
					Doc      string   `json:"doc"`
					// Simulate: the diagnose --simulate settings it shows
					// under ({} when the default simulation shows it);
					// NotSimulated: why the simulation cannot show it.
					Simulate     map[string]string `json:"simulate"`
					NotSimulated string            `json:"not_simulated,omitempty"`
					Needs        string            `json:"needs,omitempty"`
				}
				rows := make([]row, len(all))
				for i, f := range all {
					sim := f.Simulate
					if sim == nil {
						sim = map[string]string{}
					}
					rows[i] = row{f.Name, f.Stage, f.BugClass, f.Kernels, f.Doc, sim, f.NotSimulated, f.Needs}
				}
				return json.NewEncoder(s.Out).Encode(rows)
			}
			for _, f := range all {
				fmt.Fprintf(s.Out, "%-8s %-34s %s\n         kernels: %s\n", f.Stage, f.Name, f.BugClass, strings.Join(f.Kernels, ", "))
				if f.Needs != "" {
					fmt.Fprintf(s.Out, "         needs: %s\n", f.Needs)
				}
				if f.NotSimulated != "" {
					fmt.Fprintf(s.Out, "         not simulated: %s\n", f.NotSimulated)
				} else if flags := f.SimulateFlags(); flags != "" {
					fmt.Fprintf(s.Out, "         simulate with: %s\n", flags)
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, `print a JSON array of {"name", "stage", "bug_class", ...}`)
	return cmd
}
