package audit

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteText prints r for people: per model the verdict and its reason,
// then a table of replicas. Hit rates are of tokens.
func (r Report) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "audit of %s over %s\n", r.Source, time.Duration(r.WindowSeconds*float64(time.Second)).Round(time.Second))
	for _, m := range r.Models {
		fmt.Fprintf(&b, "\nmodel %s: %s\n  %s\n", m.Model, strings.ToUpper(string(m.Verdict)), m.Reason)
		if m.Shadow != nil {
			fmt.Fprintf(&b, "  shadow: kv would have found %.1f%% of %0.f prompt tokens cached\n", 100*m.Shadow.HitRate, m.Shadow.PromptTokens)
		}
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  replica\thit rate (tokens)\tqueried tokens/s\trequests/s\tpreemptions/request\tKV usage\texternal hit rate")
		for _, rep := range m.Replicas {
			usage, ext := "-", "-"
			if rep.KVUsage != nil {
				usage = fmt.Sprintf("%.1f%%", 100**rep.KVUsage)
			}
			if rep.ExternalHitRate != nil {
				ext = fmt.Sprintf("%.1f%%", 100**rep.ExternalHitRate)
			}
			fmt.Fprintf(tw, "  %s\t%.1f%%\t%.0f\t%.2f\t%.3f\t%s\t%s\n", rep.Name, 100*rep.HitRate, rep.QueryTokensPerSec, rep.RequestsPerSec, rep.PreemptionShare, usage, ext)
		}
		fmt.Fprintf(tw, "  fleet (%d)\t%.1f%%\t%.0f\t%.2f\t%.3f\n", len(m.Replicas), 100*m.HitRate, m.QueryTokensPerSec, m.RequestsPerSec, ratio(m.PreemptionsPerSec, m.RequestsPerSec))
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, rep := range m.Replicas {
			for _, warn := range rep.Warnings {
				fmt.Fprintf(&b, "  warning: %s: %s\n", rep.Name, warn)
			}
		}
	}
	for _, warn := range r.Warnings {
		fmt.Fprintf(&b, "\nwarning: %s\n", warn)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
