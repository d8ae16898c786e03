package durable_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/durable"
)

// A backup written before objects were compressed (records without an
// encoding, objects stored as their SQLite files) still verifies, inspects
// and restores, with and without a backup key; a run resumed from it
// writes compressed objects beside the old ones, and both restore.
func TestUncompressedBackupStillRestores(t *testing.T) {
	cases := []struct {
		name string
		key  durable.Key
	}{
		{"no key", nil},
		{"backup key", durable.Key(bytes.Repeat([]byte("k"), 32))},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			h := newHarness(t)
			g := updatesGen(200, 0.2, true)
			cfg := func(workers int) durable.Config {
				return h.config(workers, func(cfg *durable.Config) { cfg.Key = c.key; cfg.CompactMinBytes = 1; cfg.RetainEpochs = 3 })
			}
			run, _ := h.open(cfg(2))
			h.epochs(run, 2, 1, 6, g)
			require.NoError(t, run.Finish(false))
			require.Positive(t, run.Metrics().Compactions)
			require.NoError(t, run.Close())

			n, err := durable.Uncompress(ctx, h.bk, testFlow, c.key)
			require.NoError(t, err)
			require.Positive(t, n)
			st, err := durable.ReadState(ctx, h.bk, testFlow, c.key)
			require.NoError(t, err)
			seen := map[string]bool{}
			for _, o := range st.Commit.Objects {
				assert.Empty(t, o.Encoding, o.Key)
				seen[o.Kind] = true
			}
			assert.True(t, seen[durable.KindCompacted], "the old-format backup holds compacted objects")

			probs, err := durable.Verify(ctx, h.bk, testFlow, c.key)
			require.NoError(t, err)
			assert.Empty(t, probs)
			rep, err := durable.Inspect(ctx, h.bk, testFlow, true, c.key)
			require.NoError(t, err)
			assert.Equal(t, int64(6), rep.CommittedEpoch)
			assert.Equal(t, int64(len(h.hist.at[6])), sumCounts(rep.KeysPerStep))

			h.wipeLocal()
			run, infos := h.open(cfg(3))
			assert.Equal(t, repeat(durable.ResumeFull, 3), kinds(infos))
			requireModel(t, h.hist.at[6], stateOf(t, run, 3, h.kgc))
			h.epochs(run, 3, 7, 8, g)
			require.NoError(t, run.Finish(false))
			require.NoError(t, run.Close())

			st, err = durable.ReadState(ctx, h.bk, testFlow, c.key)
			require.NoError(t, err)
			encodings := map[string]int{}
			for _, o := range st.Commit.Objects {
				encodings[o.Encoding]++
			}
			assert.Positive(t, encodings[durable.EncodingZstd], "new objects are compressed: %v", encodings)
			probs, err = durable.Verify(ctx, h.bk, testFlow, c.key)
			require.NoError(t, err)
			assert.Empty(t, probs)
			h.wipeLocal()
			run, _ = h.open(cfg(2))
			requireModel(t, h.hist.at[8], stateOf(t, run, 2, h.kgc))
			require.NoError(t, run.Close())
		})
	}
}

func sumCounts(m map[string]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}
