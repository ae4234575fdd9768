package report

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Write prints r on out as a markdown table, or as JSON with asJSON, and,
// when htmlPath is set, first writes the HTML page there and names its
// absolute path on log ("HTML report written to PATH").
func (r *Report) Write(out, log io.Writer, asJSON bool, htmlPath string) error {
	if htmlPath != "" {
		abs, err := filepath.Abs(htmlPath)
		if err != nil {
			return fmt.Errorf("html report: %w", err)
		}
		f, err := os.Create(abs)
		if err != nil {
			return fmt.Errorf("html report: %w", err)
		}
		err = r.HTML(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("html report: %w", err)
		}
		fmt.Fprintf(log, "HTML report written to %s\n", abs)
	}
	if asJSON {
		return r.JSON(out)
	}
	return r.Markdown(out)
}
