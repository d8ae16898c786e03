package durable_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/backup/backuptest"
	"github.com/millpond/millpond/gostore/backup/s3backup"
	"github.com/millpond/millpond/gostore/durable"
	"github.com/millpond/millpond/gostore/rowbatch"
)

// newestSegment returns the key of a segment the newest commit names.
func newestSegment(t *testing.T, h *harness) durable.ObjectRef {
	t.Helper()
	st := readState(t, h.bk)
	var newest durable.ObjectRef
	for _, o := range st.Commit.Objects {
		if o.Kind == durable.KindSegment && o.LastEpoch >= newest.LastEpoch {
			newest = o
		}
	}
	require.NotEmpty(t, newest.Key)
	return newest
}

// A damaged segment fails a full resume with ErrCorrupt naming it; a
// damaged newest commit record fails Open naming it.
func TestCorruptObjects(t *testing.T) {
	cases := []struct {
		name   string
		damage func(t *testing.T, h *harness) string // returns the key expected in the error
		atOpen bool
	}{
		{"flipped segment bytes", func(t *testing.T, h *harness) string {
			o := newestSegment(t, h)
			p := h.objectPath(o.Key)
			data, err := os.ReadFile(p)
			require.NoError(t, err)
			for i := len(data) / 2; i < len(data)/2+8; i++ {
				data[i] ^= 0x5a
			}
			require.NoError(t, os.WriteFile(p, data, 0o644))
			return o.Key
		}, false},
		{"truncated segment", func(t *testing.T, h *harness) string {
			o := newestSegment(t, h)
			require.NoError(t, os.Truncate(h.objectPath(o.Key), o.Size/2))
			return o.Key
		}, false},
		{"missing segment", func(t *testing.T, h *harness) string {
			o := newestSegment(t, h)
			require.NoError(t, os.Remove(h.objectPath(o.Key)))
			return o.Key
		}, false},
		{"commit record not json", func(t *testing.T, h *harness) string {
			key := testFlow + "/commits/0000000004.json"
			require.NoError(t, os.WriteFile(h.objectPath(key), []byte(`{"format": "millpond-commit-1", "epoch": 4, `), 0o644))
			return key
		}, true},
		{"commit record edited", func(t *testing.T, h *harness) string {
			key := testFlow + "/commits/0000000004.json"
			data, err := os.ReadFile(h.objectPath(key))
			require.NoError(t, err)
			// Still valid JSON, but the checksum no longer matches.
			data = []byte(replaceOnce(string(data), `"epoch": 4`, `"epoch": 5`))
			require.NoError(t, os.WriteFile(h.objectPath(key), data, 0o644))
			return key
		}, true},
		{"commit record names an object's encoding differently", func(t *testing.T, h *harness) string {
			// The seal covers the encoding: a record edited to read a
			// compressed object as it is (or the reverse) is refused.
			key := testFlow + "/commits/0000000004.json"
			data, err := os.ReadFile(h.objectPath(key))
			require.NoError(t, err)
			edited := replaceOnce(string(data), `"encoding": "zstd"`, `"encoding": ""`)
			require.NotEqual(t, string(data), edited)
			require.NoError(t, os.WriteFile(h.objectPath(key), []byte(edited), 0o644))
			return key
		}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			run, _ := h.open(h.config(2))
			h.epochs(run, 2, 1, 4, updatesGen(120, 0.3, true))
			require.NoError(t, run.Finish(false))
			require.NoError(t, run.Close())
			key := c.damage(t, h)
			h.wipeLocal()

			ctx := context.Background()
			run, err := durable.Open(ctx, h.config(2))
			if c.atOpen {
				require.Error(t, err)
				assert.ErrorIs(t, err, durable.ErrCorrupt)
				assert.Contains(t, err.Error(), key)
				return
			}
			require.NoError(t, err)
			defer run.Close()
			var failed error
			for w := 0; w < 2 && failed == nil; w++ {
				_, failed = run.Restore(ctx, w)
			}
			require.Error(t, failed)
			if c.name != "missing segment" {
				assert.ErrorIs(t, failed, durable.ErrCorrupt)
			}
			assert.Contains(t, failed.Error(), key)
			t.Log(failed)
		})
	}
}

func replaceOnce(s, old, new string) string {
	for i := 0; i+len(old) <= len(s); i++ {
		if s[i:i+len(old)] == old {
			return s[:i] + new + s[i+len(old):]
		}
	}
	return s
}

// Objects of another flow dropped into this flow's prefix are not used by
// resume, and do not break the run.
func TestForeignSegmentIgnored(t *testing.T) {
	h := newHarness(t)
	g := updatesGen(120, 0.3, true)
	run, _ := h.open(h.config(1))
	h.epochs(run, 1, 1, 3, g)
	require.NoError(t, run.Finish(false))
	require.NoError(t, run.Close())

	// Another flow in the same backup.
	other := h.config(1, func(c *durable.Config) { c.FlowID = "flow-b"; c.LocalDir = t.TempDir() })
	orun, err := durable.Open(context.Background(), other)
	require.NoError(t, err)
	_, err = orun.Restore(context.Background(), 0)
	require.NoError(t, err)
	require.NoError(t, orun.Start())
	for e := int64(1); e <= 5; e++ {
		_, err := orun.Write(context.Background(), 0, rowbatch.NewBatch(e, rowsOf([]string{"foreign-1", "key-00001"}, "FOREIGN", false), false))
		require.NoError(t, err)
		require.NoError(t, orun.CloseEpoch(0, e))
	}
	require.NoError(t, orun.Finish(false))
	require.NoError(t, orun.Close())

	ctx := context.Background()
	segs, err := h.bk.List(ctx, "flow-b/segments/")
	require.NoError(t, err)
	require.NotEmpty(t, segs)
	tmp := filepath.Join(t.TempDir(), "seg")
	require.NoError(t, h.bk.Download(ctx, segs[len(segs)-1].Key, tmp))
	// As if it were a segment of ours, of this execution and the next.
	for _, key := range []string{
		testFlow + "/segments/000000/w0000-e0000000003-s000099.sqlite",
		testFlow + "/segments/000001/w0000-e0000000004-s000000.sqlite",
		testFlow + "/segments/stray.sqlite",
	} {
		require.NoError(t, h.bk.Upload(ctx, tmp, key))
	}

	for _, wipe := range []bool{false, true} {
		if wipe {
			h.wipeLocal()
		}
		run, _ = h.open(h.config(1))
		requireModel(t, h.hist.at[3], stateOf(t, run, 1, h.kgc))
		require.NoError(t, run.Close())
	}
	run, _ = h.open(h.config(1))
	h.epochs(run, 1, 4, 6, g)
	require.NoError(t, run.Finish(false))
	require.NoError(t, run.Close())
	h.wipeLocal()
	run, _ = h.open(h.config(1))
	requireModel(t, h.m, stateOf(t, run, 1, h.kgc))
	require.NoError(t, run.Close())
	// The other flow is untouched.
	ost, err := durable.ReadState(ctx, h.bk, "flow-b", nil)
	require.NoError(t, err)
	assert.Equal(t, int64(5), ost.Commit.Epoch)
}

// A short run and a full resume over an S3-protocol server.
func TestS3RunAndFullResume(t *testing.T) {
	url := backuptest.StartS3Server(t, nil, "millpond")
	b, err := s3backup.New(context.Background(), s3backup.Options{
		Bucket: "millpond", Prefix: "recovery", Endpoint: url, Region: "us-east-1",
		AccessKeyID: backuptest.TestAccessKeyID, SecretAccessKey: backuptest.TestSecretAccessKey,
		MaxBackoff: 10 * time.Millisecond,
	})
	require.NoError(t, err)
	h := newHarness(t)
	h.bk = b
	g := updatesGen(150, 0.2, true)
	cfg := h.config(2, func(c *durable.Config) { c.CompactMinBytes = 1; c.RetainEpochs = 1 })
	run, infos := h.open(cfg)
	assert.Equal(t, repeat(durable.ResumeFresh, 2), kinds(infos))
	h.epochs(run, 2, 1, 5, g)
	require.NoError(t, run.Finish(false))
	assert.Positive(t, run.Metrics().Compactions)
	require.NoError(t, run.Close())
	st := readState(t, b)
	assert.Equal(t, int64(5), st.Commit.Epoch)
	assertCommitComplete(t, b, st)

	h.wipeLocal()
	run, infos = h.open(h.config(3))
	assert.Equal(t, repeat(durable.ResumeFull, 3), kinds(infos))
	assert.Equal(t, int64(6), run.ResumeEpoch())
	requireModel(t, h.hist.at[5], stateOf(t, run, 3, h.kgc))
	h.epochs(run, 3, 6, 7, g)
	require.NoError(t, run.Finish(false))
	require.NoError(t, run.Close())
	h.wipeLocal()
	run, _ = h.open(h.config(3))
	requireModel(t, h.hist.at[7], stateOf(t, run, 3, h.kgc))
}
