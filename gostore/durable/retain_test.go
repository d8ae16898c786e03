package durable_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/durable"
)

// Retention by time keeps every commit record written within the window,
// and every object those records name, past the epochs retention keeps;
// without it, records older than the retained epochs and the objects only
// they named go.
func TestRetentionByTimeKeepsEveryRecordOfTheWindow(t *testing.T) {
	cases := []struct {
		name       string
		retainFor  time.Duration
		allRecords bool
	}{
		{"epochs only", 0, false},
		{"an hour", time.Hour, true},
		{"a nanosecond", time.Nanosecond, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			cfg := h.config(1, func(cfg *durable.Config) {
				cfg.CompactMinBytes = 1
				cfg.RetainEpochs = 2
				cfg.RetainFor = c.retainFor
			})
			run, _ := h.open(cfg)
			h.epochs(run, 1, 1, 12, updatesGen(40, 0.5, false))
			require.NoError(t, run.Finish(false))
			m := run.Metrics()
			assert.Positive(t, m.Compactions)
			require.NoError(t, run.Close())

			commits, err := os.ReadDir(filepath.Join(h.bdir, testFlow, "commits"))
			require.NoError(t, err)
			if c.allRecords {
				assert.Len(t, commits, int(m.Commits), "every record written is kept")
			} else {
				assert.LessOrEqual(t, len(commits), 3)
			}
			for _, e := range commits {
				data, err := os.ReadFile(filepath.Join(h.bdir, testFlow, "commits", e.Name()))
				require.NoError(t, err)
				var rec durable.CommitRecord
				require.NoError(t, json.Unmarshal(data, &rec))
				assert.InDelta(t, time.Now().Unix(), rec.CommittedUnix, 120)
				for _, o := range rec.Objects {
					assert.FileExists(t, h.objectPath(o.Key), "named by %s", e.Name())
				}
			}
		})
	}
}
