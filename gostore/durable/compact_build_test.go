package durable

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/localstore"
	"github.com/millpond/millpond/gostore/rowbatch"
	"github.com/millpond/millpond/gostore/snapfile"
)

// A compacted object is built page by page (snapfile.Builder); one past
// what a built file may hold is written through SQLite instead, from the
// start. Both hold the newest committed row of every key.
func TestCompactedObjectIsBuiltOrWrittenWhenTooLarge(t *testing.T) {
	ctx := context.Background()
	cfg := localstore.Config{Dir: t.TempDir(), FlowID: "f", WorkerIndex: 0, WorkerCount: 1, KeyGroupCount: 8}
	s, err := localstore.Open(ctx, cfg, 0)
	require.NoError(t, err)
	defer s.Close()
	want := map[string]string{}
	for epoch := int64(1); epoch <= 3; epoch++ {
		var rows []rowbatch.Row
		for i := 0; i < 12000; i += int(epoch) {
			k := fmt.Sprintf("k%06d", i)
			v := fmt.Sprintf("e%d-%d", epoch, i)
			rows = append(rows, rowbatch.Row{StepID: "s", Key: k, Epoch: epoch, Value: []byte(v)})
			if epoch <= 2 {
				want[k] = v
			}
		}
		_, err := s.Write(ctx, rowbatch.Batch{Epoch: epoch, Rows: rows})
		require.NoError(t, err)
	}
	meta := snapfile.Meta{FlowID: "f", Kind: snapfile.KindCompacted, WorkerCount: 1, KeyGroupCount: 8, LastEpoch: 2}
	for name, limit := range map[string]int{"built": 0, "written": 20} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "compacted.sqlite")
			o := snapfile.Options{Segment: true, LargePages: true, BuildPageLimit: limit}
			f, n, err := writeCompacted(ctx, s, path, meta, 2, o)
			require.NoError(t, err)
			defer f.Close()
			assert.EqualValues(t, len(want), n)
			got := map[string]string{}
			require.NoError(t, f.Scan(ctx, snapfile.ScanOptions{}, func(rows []rowbatch.Row) error {
				for _, r := range rows {
					got[r.Key] = string(r.Value)
				}
				return nil
			}))
			assert.Equal(t, want, got)
			assert.NoError(t, f.Verify(ctx))
			// A built file's change counter is 1; SQLite's writes count up.
			hdr, err := os.ReadFile(path)
			require.NoError(t, err)
			assert.Equal(t, name == "built", binary.BigEndian.Uint32(hdr[24:28]) == 1, "change counter %d", binary.BigEndian.Uint32(hdr[24:28]))
		})
	}
}
