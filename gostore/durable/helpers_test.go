package durable_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/backup"
	"github.com/millpond/millpond/gostore/backup/dirbackup"
	"github.com/millpond/millpond/gostore/durable"
	"github.com/millpond/millpond/gostore/keygroup"
	"github.com/millpond/millpond/gostore/rowbatch"
	"github.com/millpond/millpond/gostore/snapfile"
)

const (
	testFlow = "flow-a"
	testKGC  = 16
)

// model is the plain in-memory state: "step\x00key" -> value. A deleted key
// is absent.
type model map[string]string

func mkey(step, key string) string { return step + "\x00" + key }

func (m model) clone() model {
	out := make(model, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (m model) apply(rows []rowbatch.Row) {
	for _, r := range rows {
		if r.Deleted {
			delete(m, mkey(r.StepID, r.Key))
		} else {
			m[mkey(r.StepID, r.Key)] = string(r.Value)
		}
	}
}

// history keeps the model as of the end of every epoch.
type history struct {
	at map[int64]model
}

func newHistory() *history { return &history{at: map[int64]model{0: {}}} }

func (h *history) record(e int64, m model) { h.at[e] = m.clone() }

// gen makes the rows of an epoch.
type gen func(e int64) []rowbatch.Row

// updatesGen sets every key of a fixed key space in epoch 1, then changes
// a rotating `frac` share of the keys in every later epoch; with del set,
// every 7th changed key is deleted instead (and may come back later).
func updatesGen(keys int, frac float64, del bool) gen {
	return updatesGenPad(keys, frac, del, 0)
}

// updatesGenPad is updatesGen with pad more (random) bytes in every value.
func updatesGenPad(keys int, frac float64, del bool, pad int) gen {
	return func(e int64) []rowbatch.Row {
		var rows []rowbatch.Row
		n := keys
		start := 0
		if e > 1 {
			n = max(1, int(float64(keys)*frac))
			start = int(e-2) * n % keys
		}
		for i := 0; i < n; i++ {
			k := (start + i) % keys
			step := "count"
			if k%3 == 0 {
				step = "window"
			}
			key := fmt.Sprintf("key-%05d", k)
			if del && e > 1 && i%7 == 3 {
				rows = append(rows, rowbatch.Row{StepID: step, Key: key, Deleted: true})
				continue
			}
			// Random padding: objects are stored compressed, and a bound on
			// their bytes means little if the values compress to nothing.
			padding := make([]byte, pad)
			rand.New(rand.NewSource(e<<20 | int64(k))).Read(padding)
			rows = append(rows, rowbatch.Row{StepID: step, Key: key, Value: []byte(fmt.Sprintf("v%d-e%d-%s%s", k, e, strings.Repeat("x", k%13), padding))})
		}
		return rows
	}
}

// route splits rows by owning worker.
func route(rows []rowbatch.Row, workers, kgc int) [][]rowbatch.Row {
	out := make([][]rowbatch.Row, workers)
	for _, r := range rows {
		w := keygroup.Owner(keygroup.Of(r.Key, kgc), kgc, workers)
		out[w] = append(out[w], r)
	}
	return out
}

// harness holds what survives between runs: the local state directory and
// the backup.
type harness struct {
	t     *testing.T
	local string
	bdir  string
	bk    backup.Backup
	kgc   int
	hist  *history
	m     model
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	bdir := t.TempDir()
	bk, err := dirbackup.New(bdir, nil)
	require.NoError(t, err)
	return &harness{t: t, local: t.TempDir(), bdir: bdir, bk: bk, kgc: testKGC, hist: newHistory(), m: model{}}
}

func (h *harness) config(workers int, mods ...func(*durable.Config)) durable.Config {
	cfg := durable.Config{
		LocalDir: h.local, FlowID: testFlow, WorkerCount: workers, KeyGroupCount: h.kgc,
		Backup: h.bk, Mode: durable.SnapshotBatch, UploadAttempts: 2,
	}
	if os.Getenv("DURABLE_TEST_LOG") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	for _, m := range mods {
		m(&cfg)
	}
	return cfg
}

// open opens a run, restores every worker and starts it.
func (h *harness) open(cfg durable.Config) (*durable.Run, []durable.RestoreInfo) {
	h.t.Helper()
	ctx := context.Background()
	run, err := durable.Open(ctx, cfg)
	require.NoError(h.t, err)
	infos := make([]durable.RestoreInfo, cfg.WorkerCount)
	for w := range infos {
		infos[w], err = run.Restore(ctx, w)
		require.NoError(h.t, err, "restore worker %d", w)
	}
	require.NoError(h.t, run.Start())
	h.t.Cleanup(func() { run.Close() })
	return run, infos
}

// epoch writes one epoch's rows on every worker and closes it everywhere,
// updating the model. The model of the epoch is recorded once its rows
// are written: a close that fails may still leave the epoch committed (a
// commit record that landed but was reported failed), and a test compares
// whatever epoch committed with the model of that epoch.
func (h *harness) epoch(run *durable.Run, workers int, e int64, rows []rowbatch.Row) error {
	ctx := context.Background()
	parts := route(rows, workers, h.kgc)
	for w := 0; w < workers; w++ {
		if _, err := run.Write(ctx, w, rowbatch.NewBatch(e, parts[w], false)); err != nil {
			return err
		}
	}
	h.m.apply(rows)
	h.hist.record(e, h.m)
	for w := 0; w < workers; w++ {
		if err := run.CloseEpoch(w, e); err != nil {
			return err
		}
	}
	return nil
}

// epochs runs epochs from..to (inclusive) with rows from g.
func (h *harness) epochs(run *durable.Run, workers int, from, to int64, g gen) {
	h.t.Helper()
	for e := from; e <= to; e++ {
		require.NoError(h.t, h.epoch(run, workers, e, g(e)), "epoch %d", e)
	}
}

// rollback resets the model to the state at epoch e (a resume there).
func (h *harness) rollback(e int64) {
	h.t.Helper()
	m, ok := h.hist.at[e]
	require.True(h.t, ok, "no model at epoch %d", e)
	h.m = m.clone()
	for k := range h.hist.at {
		if k > e {
			delete(h.hist.at, k)
		}
	}
}

// stateOf reads the live state of every worker's store and checks that each
// worker holds only keys of its own key groups.
func stateOf(t *testing.T, run *durable.Run, workers, kgc int) model {
	t.Helper()
	ctx := context.Background()
	out := model{}
	for w := 0; w < workers; w++ {
		var cur snapfile.Cursor
		for {
			page, next, done, err := run.Store(w).ScanPage(ctx, snapfile.ScanOptions{ChunkRows: 500}, cur)
			require.NoError(t, err)
			for _, r := range page {
				require.False(t, r.Deleted)
				owner := keygroup.Owner(keygroup.Of(r.Key, kgc), kgc, workers)
				require.Equal(t, w, owner, "worker %d holds key %q of worker %d", w, r.Key, owner)
				_, dup := out[mkey(r.StepID, r.Key)]
				require.False(t, dup, "key %q held twice", r.Key)
				out[mkey(r.StepID, r.Key)] = string(r.Value)
			}
			if done {
				break
			}
			cur = next
		}
	}
	return out
}

func requireModel(t *testing.T, want, got model) {
	t.Helper()
	if len(want) == len(got) {
		equal := true
		for k, v := range want {
			if got[k] != v {
				equal = false
				break
			}
		}
		if equal {
			return
		}
	}
	var diffs []string
	for k, v := range want {
		if g, ok := got[k]; !ok {
			diffs = append(diffs, fmt.Sprintf("missing %q", k))
		} else if g != v {
			diffs = append(diffs, fmt.Sprintf("%q: want %q got %q", k, v, g))
		}
	}
	for k, v := range got {
		if _, ok := want[k]; !ok {
			diffs = append(diffs, fmt.Sprintf("extra %q=%q", k, v))
		}
	}
	sort.Strings(diffs)
	if len(diffs) > 10 {
		diffs = append(diffs[:10], fmt.Sprintf("... %d more", len(diffs)-10))
	}
	t.Fatalf("state differs from the model (%d keys wanted, %d got):\n%s", len(want), len(got), strings.Join(diffs, "\n"))
}

// list returns the objects under the flow's sub-prefix.
func list(t *testing.T, b backup.Backup, sub string) []backup.ObjectInfo {
	t.Helper()
	objs, err := b.List(context.Background(), testFlow+"/"+sub)
	require.NoError(t, err)
	return objs
}

func readState(t *testing.T, b backup.Backup) durable.State {
	t.Helper()
	st, err := durable.ReadState(context.Background(), b, testFlow, nil)
	require.NoError(t, err)
	return st
}

// wipeLocal removes the local state directory's content (a lost disk).
func (h *harness) wipeLocal() {
	h.t.Helper()
	require.NoError(h.t, os.RemoveAll(filepath.Join(h.local, testFlow)))
}

// objectPath is where DirBackup keeps an object.
func (h *harness) objectPath(key string) string {
	return filepath.Join(h.bdir, filepath.FromSlash(key))
}

func kinds(infos []durable.RestoreInfo) []string {
	out := make([]string, len(infos))
	for i, in := range infos {
		out[i] = in.Kind
	}
	return out
}

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

type rowbatchRow = rowbatch.Row

// rowsOf sets (or deletes) keys of step "s".
func rowsOf(keys []string, v string, deleted bool) []rowbatch.Row {
	out := make([]rowbatch.Row, len(keys))
	for i, k := range keys {
		out[i] = rowbatch.Row{StepID: "s", Key: k, Deleted: deleted}
		if !deleted {
			out[i].Value = []byte(v + "-" + k)
		}
	}
	return out
}

const (
	waitFor = 10 * time.Second
	tick    = 5 * time.Millisecond
)

// assertNoGarbage checks that every segment and compacted object in the
// backup is named by a commit record that is still there.
func assertNoGarbage(t *testing.T, b backup.Backup) {
	t.Helper()
	ctx := context.Background()
	referenced := map[string]bool{}
	for _, o := range list(t, b, "commits/") {
		tmp := filepath.Join(t.TempDir(), "rec.json")
		require.NoError(t, b.Download(ctx, o.Key, tmp))
		data, err := os.ReadFile(tmp)
		require.NoError(t, err)
		var rec durable.CommitRecord
		require.NoError(t, json.Unmarshal(data, &rec), o.Key)
		for _, ref := range rec.Objects {
			referenced[ref.Key] = true
		}
	}
	for _, sub := range []string{"segments/", "compacted/"} {
		for _, o := range list(t, b, sub) {
			assert.True(t, referenced[o.Key], "%s is named by no commit record: garbage left behind", o.Key)
		}
	}
}
