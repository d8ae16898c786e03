package durable_test

import (
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/backup"
	"github.com/millpond/millpond/gostore/durable"
)

// sizeless lists objects without their sizes, as a backup written in
// Python does (the Backup protocol's list_keys has no sizes).
type sizeless struct{ backup.Backup }

func (s sizeless) List(ctx context.Context, prefix string) ([]backup.ObjectInfo, error) {
	objs, err := s.Backup.List(ctx, prefix)
	for i := range objs {
		objs[i].Size = -1
	}
	return objs, err
}

func TestVerify(t *testing.T) {
	cases := []struct {
		name    string
		damage  func(h *harness, seg string)
		sizes   bool
		problem string // "" for a clean report
	}{
		{"healthy", func(*harness, string) {}, true, ""},
		{"healthy, listed without sizes", func(*harness, string) {}, false, ""},
		{"truncated segment", func(h *harness, seg string) { truncate(t, h.objectPath(seg)) }, true, "truncated or replaced"},
		{"truncated segment, listed without sizes", func(h *harness, seg string) { truncate(t, h.objectPath(seg)) }, false, "checksum mismatch"},
		{"missing segment", func(h *harness, seg string) { require.NoError(t, os.Remove(h.objectPath(seg))) }, true, "missing"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			run, _ := h.open(h.config(1, func(cfg *durable.Config) { cfg.CompactMinBytes = 1 << 40 }))
			h.epochs(run, 1, 1, 3, updatesGen(50, 0.2, true))
			require.NoError(t, run.Finish(false))
			require.NoError(t, run.Close())
			seg := list(t, h.bk, "segments/")[0].Key
			c.damage(h, seg)
			var b backup.Backup = h.bk
			if !c.sizes {
				b = sizeless{h.bk}
			}
			probs, err := durable.Verify(context.Background(), b, testFlow, nil)
			require.NoError(t, err)
			if c.problem == "" {
				assert.Empty(t, probs)
				return
			}
			require.NotEmpty(t, probs)
			assert.Equal(t, seg, probs[0].Key)
			assert.Contains(t, probs[0].Problem, c.problem)
		})
	}
}

func truncate(t *testing.T, path string) {
	t.Helper()
	st, err := os.Stat(path)
	require.NoError(t, err)
	require.NoError(t, os.Truncate(path, st.Size()/2))
}
