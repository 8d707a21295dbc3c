package console

import "github.com/pgbox/pgbox/inspect"

// horizonWarnings warns when the xmin horizon is held past inspect's bound
// (the one docs/alerts.yml fires on); the overview's "horizon" partial
// (assets/horizon.html) shows the holders either way.
func horizonWarnings(s *inspect.Snapshot) []string {
	if !s.Horizon.Over() {
		return nil
	}
	return []string{"Database: the xmin horizon is " + s.Horizon.Summary() + "."}
}
