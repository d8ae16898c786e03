package snapfile

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/rowbatch"
)

// A flipped bit in a step id, which listing the steps reads without a
// row's checksum, is damage, not a step id the caller cannot decode.
func TestStepsReportsAStepIDThatIsNotUTF8AsDamage(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "s.sqlite")
	f, err := Create(ctx, path, testMeta(), Options{})
	require.NoError(t, err)
	_, err = f.Write(ctx, []rowbatch.Row{{StepID: "flow.stepQ", Key: "k", Epoch: 1, Value: []byte("v")}})
	require.NoError(t, err)
	steps, err := f.Steps(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"flow.stepQ"}, steps)
	require.NoError(t, f.Checkpoint(ctx))
	require.NoError(t, f.Close())

	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Positive(t, bytes.Count(data, []byte("flow.stepQ")))
	require.NoError(t, os.WriteFile(path, bytes.ReplaceAll(data, []byte("flow.stepQ"), []byte("flow.step\xff")), 0o644))

	f, err = Open(ctx, path, Options{})
	require.NoError(t, err)
	defer f.Close()
	_, err = f.Steps(ctx)
	require.ErrorIs(t, err, ErrDamaged)
	require.Contains(t, err.Error(), "not UTF-8")
}
