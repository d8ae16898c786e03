package durable_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/durable"
	"github.com/millpond/millpond/gostore/localstore"
	"github.com/millpond/millpond/gostore/rowbatch"
)

func TestOpenErrors(t *testing.T) {
	h := newHarness(t)
	run, _ := h.open(h.config(1))
	h.epochs(run, 1, 1, 2, updatesGen(20, 1, false))
	require.NoError(t, run.Finish(false))
	require.NoError(t, run.Close())

	cases := []struct {
		name string
		mod  func(c *durable.Config)
		want []string
	}{
		{"local dir is a file", func(c *durable.Config) { c.LocalDir = fileIn(t) }, []string{"afile", "exists and is not a directory"}},
		{"no backup", func(c *durable.Config) { c.Backup = nil }, []string{"backup"}},
		{"bad flow id", func(c *durable.Config) { c.FlowID = "a/b" }, []string{"a/b"}},
		{"more workers than key groups", func(c *durable.Config) { c.WorkerCount = testKGC + 1 }, []string{"key-group count"}},
		{"key-group count changed", func(c *durable.Config) { c.KeyGroupCount = 32 }, []string{"16 key groups", "not 32"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := durable.Open(context.Background(), h.config(1, c.mod))
			require.Error(t, err)
			for _, w := range c.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

func fileIn(t *testing.T) string {
	path := filepath.Join(t.TempDir(), "afile")
	require.NoError(t, os.WriteFile(path, []byte("x"), 0o644))
	return path
}

// A local state directory that does not exist is made, parents and all.
func TestOpenMakesAMissingLocalDir(t *testing.T) {
	h := newHarness(t)
	dir := filepath.Join(t.TempDir(), "not", "yet")
	run, err := durable.Open(context.Background(), h.config(1, func(c *durable.Config) { c.LocalDir = dir }))
	require.NoError(t, err)
	require.NoError(t, run.Close())
	st, err := os.Stat(dir)
	require.NoError(t, err)
	assert.True(t, st.IsDir())
}

// Two runs of one flow on one local directory: the second cannot take the
// workers' stores.
func TestSecondRunOnSameLocalDirIsRefused(t *testing.T) {
	h := newHarness(t)
	run, _ := h.open(h.config(1))
	h.epochs(run, 1, 1, 2, updatesGen(20, 1, false))
	ctx := context.Background()
	second, err := durable.Open(ctx, h.config(1))
	require.NoError(t, err)
	defer second.Close()
	_, err = second.Restore(ctx, 0)
	require.Error(t, err)
	assert.ErrorIs(t, err, localstore.ErrLocked)
	require.NoError(t, run.Finish(false))
}

// A full resume reports what it downloaded.
func TestFullResumeProgress(t *testing.T) {
	h := newHarness(t)
	run, _ := h.open(h.config(2))
	h.epochs(run, 2, 1, 3, updatesGen(50, 0.5, true))
	require.NoError(t, run.Finish(false))
	require.NoError(t, run.Close())
	h.wipeLocal()
	run, infos := h.open(h.config(2))
	p := run.Progress()
	assert.Positive(t, p.ObjectsTotal.Load())
	assert.Equal(t, p.ObjectsTotal.Load(), p.ObjectsDone.Load())
	assert.Equal(t, p.BytesTotal.Load(), p.BytesDone.Load())
	var objects int
	var rows int64
	for _, in := range infos {
		objects += in.Objects
		rows += in.Rows
	}
	assert.Equal(t, int(p.ObjectsDone.Load()), objects)
	assert.Equal(t, int64(len(h.m)), rows, "restored rows count live keys")
}

// Using a run after Finish is an error, not a crash.
func TestWriteAfterFinish(t *testing.T) {
	h := newHarness(t)
	run, _ := h.open(h.config(1))
	h.epochs(run, 1, 1, 1, updatesGen(10, 1, false))
	require.NoError(t, run.Finish(false))
	assert.NotPanics(t, func() {
		_, err := run.Write(context.Background(), 0, rowbatch.NewBatch(2, rowsOf([]string{"x"}, "v", false), false))
		assert.Error(t, err)
		assert.Error(t, run.CloseEpoch(0, 2))
	})
	require.NoError(t, run.Finish(false), "Finish twice is harmless")
}
