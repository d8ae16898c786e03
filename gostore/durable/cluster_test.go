package durable_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
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

// fakeNet is an in-memory cluster: one inbox per process, FIFO per pair
// (one lock orders every send), a filter to lose messages, and a way to
// fail it (every inbox closes, every send errs).
type fakeNet struct {
	mu    sync.Mutex
	boxes []chan durable.ClusterMessage
	err   error
	// drop, when set, loses the messages it returns true for.
	drop func(from, to int, m map[string]any) bool
	// late, when set, is how long Send takes to return after it
	// delivered a message (a transport whose send returns after the
	// peer already answered).
	late func(from, to int, m map[string]any) time.Duration
}

func newFakeNet(n int) *fakeNet {
	f := &fakeNet{}
	for range n {
		f.boxes = append(f.boxes, make(chan durable.ClusterMessage, 4096))
	}
	return f
}

func (f *fakeNet) node(i int) durable.Cluster { return &fakeNode{net: f, index: i} }

func (f *fakeNet) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return
	}
	f.err = err
	for _, b := range f.boxes {
		close(b)
	}
}

func (f *fakeNet) setDrop(drop func(from, to int, m map[string]any) bool) {
	f.mu.Lock()
	f.drop = drop
	f.mu.Unlock()
}

// inject delivers payload to process `to` as if `from` sent it.
func (f *fakeNet) inject(from, to int, payload []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.boxes[to] <- durable.ClusterMessage{From: from, Payload: payload}
}

type fakeNode struct {
	net   *fakeNet
	index int
}

// lateness is how long a send of payload to `to` returns late.
func (n *fakeNode) lateness(to int, payload []byte) time.Duration {
	n.net.mu.Lock()
	late := n.net.late
	n.net.mu.Unlock()
	var m map[string]any
	if late == nil || json.Unmarshal(payload, &m) != nil {
		return 0
	}
	return late(n.index, to, m)
}

func (n *fakeNode) Index() int { return n.index }
func (n *fakeNode) Count() int { return len(n.net.boxes) }
func (n *fakeNode) Err() error {
	n.net.mu.Lock()
	defer n.net.mu.Unlock()
	return n.net.err
}
func (n *fakeNode) Inbox() <-chan durable.ClusterMessage { return n.net.boxes[n.index] }

func (n *fakeNode) Send(to int, payload []byte) error {
	if wait := n.lateness(to, payload); wait > 0 {
		defer time.Sleep(wait) // after the delivery below
	}
	f := n.net
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	if to < 0 || to >= len(f.boxes) || to == n.index {
		return fmt.Errorf("no process %d", to)
	}
	if f.drop != nil {
		var m map[string]any
		if json.Unmarshal(payload, &m) == nil && f.drop(n.index, to, m) {
			return nil
		}
	}
	select {
	case f.boxes[to] <- durable.ClusterMessage{From: n.index, Payload: append([]byte(nil), payload...)}:
		return nil
	default:
		return errors.New("inbox full")
	}
}

// proc is one process of a cluster run.
type proc struct {
	run            *durable.Run
	first, workers int
	infos          []durable.RestoreInfo
}

// clusterHarness holds what survives between cluster runs: one local
// state directory per process index and the shared backup.
type clusterHarness struct {
	t      *testing.T
	mu     sync.Mutex // locals
	bk     backup.Backup
	locals []string
	kgc    int
	hist   *history
	m      model
}

func newClusterHarness(t *testing.T) *clusterHarness {
	bk, err := dirbackup.New(t.TempDir(), nil)
	require.NoError(t, err)
	return &clusterHarness{t: t, bk: bk, kgc: testKGC, hist: newHistory(), m: model{}}
}

func (h *clusterHarness) local(p int) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	for len(h.locals) <= p {
		h.locals = append(h.locals, h.t.TempDir())
	}
	return h.locals[p]
}

// config is process p's config of a flow of n processes with w workers
// each (a run of its own when net is nil).
func (h *clusterHarness) config(net *fakeNet, p, n, w int, mods ...func(*durable.Config)) durable.Config {
	cfg := durable.Config{
		LocalDir: h.local(p), FlowID: testFlow, WorkerCount: n * w, KeyGroupCount: h.kgc,
		Backup: h.bk, Mode: durable.SnapshotBatch, UploadAttempts: 2, StartTimeout: 20 * time.Second,
	}
	if net != nil {
		cfg.Cluster, cfg.FirstWorker, cfg.Workers = net.node(p), p*w, w
	}
	for _, m := range mods {
		m(&cfg)
	}
	return cfg
}

// parallel runs f for 0..n-1 at once and returns their errors.
func parallel(n int, f func(p int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for p := range n {
		wg.Go(func() { errs[p] = f(p) })
	}
	wg.Wait()
	return errs
}

// openProc opens, restores and starts one process.
func openProc(cfg durable.Config) (*proc, error) {
	ctx := context.Background()
	run, err := durable.Open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	pr := &proc{run: run}
	pr.first, pr.workers = run.HostedWorkers()
	for w := pr.first; w < pr.first+pr.workers; w++ {
		info, err := run.Restore(ctx, w)
		if err != nil {
			run.Close()
			return nil, err
		}
		pr.infos = append(pr.infos, info)
	}
	if err := run.Start(); err != nil {
		run.Close()
		return nil, err
	}
	return pr, nil
}

// start opens n processes of w workers each at once (a run of its own
// when n is 1 and plain is set).
func (h *clusterHarness) start(n, w int, plain bool, mods ...func(*durable.Config)) ([]*proc, *fakeNet) {
	h.t.Helper()
	var net *fakeNet
	if !plain {
		net = newFakeNet(n)
	}
	procs := make([]*proc, n)
	errs := parallel(n, func(p int) error {
		var err error
		procs[p], err = openProc(h.config(net, p, n, w, mods...))
		return err
	})
	for p, err := range errs {
		require.NoError(h.t, err, "process %d", p)
	}
	for _, pr := range procs {
		h.t.Cleanup(func() { pr.run.Close() })
	}
	return procs, net
}

// epochs writes epochs from..to with rows from g on every process at once
// (each its own workers' rows) and returns the processes' errors.
func (h *clusterHarness) epochs(procs []*proc, from, to int64, g gen) []error {
	rows := map[int64][]rowbatch.Row{}
	for e := from; e <= to; e++ {
		rows[e] = g(e)
		h.m.apply(rows[e])
		h.hist.record(e, h.m)
	}
	count := 0
	for _, pr := range procs {
		count += pr.workers
	}
	ctx := context.Background()
	return parallel(len(procs), func(p int) error {
		pr := procs[p]
		for e := from; e <= to; e++ {
			parts := route(rows[e], count, h.kgc)
			for w := pr.first; w < pr.first+pr.workers; w++ {
				if _, err := pr.run.Write(ctx, w, rowbatch.NewBatch(e, parts[w], false)); err != nil {
					return err
				}
			}
			for w := pr.first; w < pr.first+pr.workers; w++ {
				if err := pr.run.CloseEpoch(w, e); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

func (h *clusterHarness) mustEpochs(procs []*proc, from, to int64, g gen) {
	h.t.Helper()
	for p, err := range h.epochs(procs, from, to, g) {
		require.NoError(h.t, err, "process %d", p)
	}
}

// finish finishes every process at once and closes them.
func (h *clusterHarness) finish(procs []*proc) {
	h.t.Helper()
	errs := parallel(len(procs), func(p int) error { return procs[p].run.Finish(false) })
	for p, err := range errs {
		require.NoError(h.t, err, "finish process %d", p)
	}
	for _, pr := range procs {
		require.NoError(h.t, pr.run.Close())
	}
}

// clusterState reads every process's hosted stores and checks that each
// worker holds only keys of its own key groups.
func clusterState(t *testing.T, procs []*proc, kgc int) model {
	t.Helper()
	count := 0
	for _, pr := range procs {
		count += pr.workers
	}
	ctx := context.Background()
	out := model{}
	for _, pr := range procs {
		for w := pr.first; w < pr.first+pr.workers; w++ {
			owned := keygroup.OwnedBy(w, count, kgc)
			var cur snapfile.Cursor
			for {
				page, next, done, err := pr.run.Store(w).ScanPage(ctx, snapfile.ScanOptions{ChunkRows: 500}, cur)
				require.NoError(t, err)
				for _, r := range page {
					require.False(t, r.Deleted)
					g := keygroup.Of(r.Key, kgc)
					require.True(t, g >= owned.Lo && g < owned.Hi, "worker %d of %d holds key %q of group %d, outside its groups %d..%d", w, count, r.Key, g, owned.Lo, owned.Hi-1)
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
	}
	return out
}

// readBack is the committed state of bk, rebuilt by a fresh one-worker
// run in a directory of its own (it records nothing).
func readBack(t *testing.T, bk backup.Backup, kgc int) model {
	t.Helper()
	ctx := context.Background()
	run, err := durable.Open(ctx, durable.Config{LocalDir: t.TempDir(), FlowID: testFlow, WorkerCount: 1, KeyGroupCount: kgc, Backup: bk})
	require.NoError(t, err)
	_, err = run.Restore(ctx, 0)
	require.NoError(t, err)
	m := stateOf(t, run, 1, kgc)
	require.NoError(t, run.Close())
	return m
}

// withEmpty makes the epochs listed write no rows at all.
func withEmpty(g gen, empty ...int64) gen {
	return func(e int64) []rowbatch.Row {
		for _, x := range empty {
			if x == e {
				return nil
			}
		}
		return g(e)
	}
}

// requireCovered checks that every retained commit record names, for
// every epoch it covers and every worker that wrote rows in it, a segment
// of that worker and epoch (or compacted state past it), and that nothing
// it names is missing or damaged.
func requireCovered(t *testing.T, bk backup.Backup, workers, kgc int, from int64, rowsAt map[int64][]rowbatch.Row) {
	t.Helper()
	ctx := context.Background()
	probs, err := durable.Verify(ctx, bk, testFlow, nil)
	require.NoError(t, err)
	require.Empty(t, probs)
	st := readState(t, bk)
	for _, e := range st.CommitEpochs {
		var rec durable.CommitRecord
		tmp := filepath.Join(t.TempDir(), "rec.json")
		require.NoError(t, bk.Download(ctx, fmt.Sprintf("%s/commits/%010d.json", testFlow, e), tmp))
		rec = readRecord(t, tmp)
		have := map[[2]int64]bool{}
		var compacted int64
		for _, o := range rec.Objects {
			if o.Kind == durable.KindCompacted {
				compacted = max(compacted, o.LastEpoch)
				continue
			}
			have[[2]int64{int64(o.Worker), o.LastEpoch}] = true
		}
		for x := max(from, compacted+1); x <= rec.Epoch; x++ {
			for w, part := range route(rowsAt[x], workers, kgc) {
				if len(part) > 0 {
					assert.True(t, have[[2]int64{int64(w), x}], "the commit record of epoch %d names no segment of worker %d epoch %d", rec.Epoch, w, x)
				}
			}
		}
	}
}

func readRecord(t *testing.T, path string) durable.CommitRecord {
	t.Helper()
	var rec durable.CommitRecord
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &rec))
	return rec
}

// rowsOfEpochs returns g's rows of epochs from..to.
func rowsOfEpochs(g gen, from, to int64) map[int64][]rowbatch.Row {
	out := map[int64][]rowbatch.Row{}
	for e := from; e <= to; e++ {
		out[e] = g(e)
	}
	return out
}

// A flow run as 2 or 3 processes of 1 or 2 workers commits one record per
// commit naming every worker's segments, and its state is exactly what a
// run of its own with the same rows writes.
func TestClusterCommitsEveryProcessesSegments(t *testing.T) {
	for _, c := range []struct{ n, w int }{{2, 1}, {2, 2}, {3, 1}, {3, 2}} {
		t.Run(fmt.Sprintf("%dx%d", c.n, c.w), func(t *testing.T) {
			h := newClusterHarness(t)
			g := withEmpty(updatesGen(240, 0.25, true), 3, 6)
			procs, _ := h.start(c.n, c.w, false, func(cfg *durable.Config) { cfg.RetainEpochs = 100 })
			assert.Equal(t, int64(0), procs[1].run.Execution())
			assert.Equal(t, int64(1), procs[1].run.ResumeEpoch())
			h.mustEpochs(procs, 1, 7, g)
			h.finish(procs)
			for p, pr := range procs {
				assert.Equal(t, int64(7), pr.run.Committed(), "process %d", p)
				assert.Positive(t, pr.run.Metrics().Commits, "process %d", p)
			}
			m := procs[0].run.Metrics()
			assert.Positive(t, m.RemoteUploads)
			assert.Zero(t, m.WholeEpochs)
			assert.Positive(t, procs[1].run.Metrics().ClusterSent)

			st := readState(t, h.bk)
			assert.Equal(t, int64(7), st.Commit.Epoch)
			assert.Equal(t, int64(0), st.LastExecution)
			assert.Equal(t, c.n*c.w, st.Commit.WorkerCount)
			assert.Len(t, list(t, h.bk, "executions/"), 1, "the leader alone records the execution")
			workers := map[int]bool{}
			for _, o := range st.Commit.Objects {
				workers[o.Worker] = true
			}
			assert.Len(t, workers, c.n*c.w, "the record names objects of every worker")
			requireCovered(t, h.bk, c.n*c.w, h.kgc, 1, rowsOfEpochs(g, 1, 7))
			got := readBack(t, h.bk, h.kgc)
			requireModel(t, h.hist.at[7], got)

			// The same rows, one process.
			single := newHarness(t)
			run, _ := single.open(single.config(c.n * c.w))
			single.epochs(run, c.n*c.w, 1, 7, g)
			require.NoError(t, run.Finish(false))
			require.NoError(t, run.Close())
			requireModel(t, readBack(t, single.bk, single.kgc), got)

			// The next run of the same layout resumes fast everywhere.
			procs, _ = h.start(c.n, c.w, false)
			for p, pr := range procs {
				assert.Equal(t, int64(1), pr.run.Execution())
				assert.Equal(t, int64(8), pr.run.ResumeEpoch())
				assert.Equal(t, repeat(durable.ResumeFast, c.w), kinds(pr.infos), "process %d", p)
			}
			requireModel(t, h.hist.at[7], clusterState(t, procs, h.kgc))
			h.mustEpochs(procs, 8, 9, g)
			h.finish(procs)
			requireModel(t, h.hist.at[9], readBack(t, h.bk, h.kgc))
		})
	}
}

// A follower's report of an epoch can be answered (the leader commits it
// and sends the record) before the follower's send of the report has
// returned; the record is applied, not refused as one of an epoch never
// reported, and the run finishes with every epoch committed.
func TestClusterRecordArrivingBeforeTheReportSendReturns(t *testing.T) {
	h := newClusterHarness(t)
	g := updatesGen(60, 0.5, false)
	procs, net := h.start(3, 1, false)
	net.mu.Lock()
	net.late = func(from, to int, m map[string]any) time.Duration {
		if from != 0 && m["type"] == "uploaded" {
			return 40 * time.Millisecond
		}
		return 0
	}
	net.mu.Unlock()
	h.mustEpochs(procs, 1, 6, g)
	h.finish(procs)
	for p, pr := range procs {
		assert.Equal(t, int64(6), pr.run.Committed(), "process %d", p)
	}
	requireModel(t, h.hist.at[6], readBack(t, h.bk, h.kgc))
}

// Full resumes across process and worker counts rebuild each worker's key
// groups from objects written under any earlier layout; an unchanged
// layout resumes fast.
func TestClusterRescale(t *testing.T) {
	h := newClusterHarness(t)
	g := updatesGen(300, 0.2, true)
	steps := []struct {
		n, w  int
		plain bool
		kind  string
	}{
		{1, 1, true, durable.ResumeFresh},
		{2, 2, false, durable.ResumeFull},
		{2, 2, false, durable.ResumeFast},
		{3, 1, false, durable.ResumeFull},
		{1, 2, false, durable.ResumeFull},
		{1, 2, true, durable.ResumeFast},
	}
	var epoch int64
	for i, s := range steps {
		procs, _ := h.start(s.n, s.w, s.plain)
		for p, pr := range procs {
			assert.Equal(t, repeat(s.kind, s.w), kinds(pr.infos), "step %d (%dx%d) process %d: %v", i, s.n, s.w, p, pr.infos)
			assert.Equal(t, epoch+1, pr.run.ResumeEpoch())
		}
		requireModel(t, h.hist.at[epoch], clusterState(t, procs, h.kgc))
		h.mustEpochs(procs, epoch+1, epoch+3, g)
		epoch += 3
		h.finish(procs)
	}
	requireModel(t, h.hist.at[epoch], readBack(t, h.bk, h.kgc))
}

// A follower that dies (the cluster fails, or it closes its run) stops
// every process: no record after it names a missing object or a partial
// epoch, and the rerun resumes from the last committed epoch exactly.
func TestClusterFollowerKilled(t *testing.T) {
	cases := []struct {
		name string
		// kill stops process 1 after epoch 4 was written and closed
		// everywhere (and, with lose, its report of epoch 4 lost).
		lose bool
		kill func(net *fakeNet, procs []*proc)
	}{
		{"cluster fails after the follower uploaded epoch 4", true, func(net *fakeNet, procs []*proc) {
			net.fail(errors.New("process 1 killed"))
		}},
		{"follower closes its run", true, func(net *fakeNet, procs []*proc) {
			procs[1].run.Close()
		}},
		{"cluster fails at any moment", false, func(net *fakeNet, procs []*proc) {
			net.fail(errors.New("process 1 killed"))
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newClusterHarness(t)
			g := updatesGen(200, 0.3, true)
			procs, net := h.start(2, 2, false)
			h.mustEpochs(procs, 1, 3, g)
			require.Eventually(t, func() bool { return procs[0].run.Committed() == 3 }, waitFor, tick)
			if c.lose {
				net.setDrop(func(from, to int, m map[string]any) bool {
					return from == 1 && m["type"] == "uploaded" && m["epoch"] == float64(4)
				})
			}
			errs := h.epochs(procs, 4, 4, g)
			require.NoError(t, errors.Join(errs...))
			if c.lose {
				// The follower's segments of epoch 4 are in the backup.
				require.Eventually(t, func() bool {
					n := 0
					for _, o := range list(t, h.bk, "segments/") {
						if strings.Contains(o.Key, "-e0000000004-") && (strings.Contains(o.Key, "/w0002-") || strings.Contains(o.Key, "/w0003-")) {
							n++
						}
					}
					return n == 2
				}, waitFor, tick)
			}
			c.kill(net, procs)
			// Every process fails, and every wait returns.
			errs = parallel(2, func(p int) error { return procs[p].run.Finish(false) })
			if c.lose {
				require.Error(t, errs[0])
				assert.ErrorIs(t, errs[0], durable.ErrCluster)
				if c.name != "follower closes its run" {
					require.Error(t, errs[1])
				}
			}
			for _, pr := range procs {
				pr.run.Close()
			}
			committed := readState(t, h.bk).Commit.Epoch
			if c.lose {
				assert.Equal(t, int64(3), committed, "epoch 4 lacks the follower's report")
			} else {
				assert.GreaterOrEqual(t, committed, int64(3))
			}
			requireCovered(t, h.bk, 4, h.kgc, 1, rowsOfEpochs(g, 1, 4))
			requireModel(t, h.hist.at[committed], readBack(t, h.bk, h.kgc))

			// The rerun: from the last commit, exactly.
			h.rollback(committed)
			procs, _ = h.start(2, 2, false)
			for p, pr := range procs {
				assert.Equal(t, committed+1, pr.run.ResumeEpoch(), "process %d", p)
			}
			requireModel(t, h.hist.at[committed], clusterState(t, procs, h.kgc))
			h.mustEpochs(procs, committed+1, 7, g)
			h.finish(procs)
			requireModel(t, h.hist.at[7], readBack(t, h.bk, h.kgc))
			assertNoGarbage(t, h.bk)
		})
	}
}

func (h *clusterHarness) rollback(e int64) {
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

// Compaction in a cluster: every process compacts its workers, and the
// leader's record names all their compacted objects in place of the
// segments; the state restores exactly from it, in any layout.
func TestClusterCompaction(t *testing.T) {
	h := newClusterHarness(t)
	g := updatesGen(300, 0.3, true)
	small := func(c *durable.Config) { c.CompactMinBytes = 1; c.RetainEpochs = 2 }
	procs, _ := h.start(3, 1, false, small)
	h.mustEpochs(procs, 1, 8, g)
	require.Eventually(t, func() bool { return procs[0].run.Metrics().Compactions > 0 }, waitFor, tick)
	// Let the compaction that the last commits started end before the run
	// does: a round still waiting on the followers at Finish is given up,
	// and this test counts the followers' compactions below. (What such a
	// round leaves is collected: TestClusterFinishDuringCompaction...)
	require.Eventually(t, func() bool { return procs[0].run.Committed() == 8 }, waitFor, tick)
	awaitCompactionsSettled(t, procs[0].run)
	h.finish(procs)
	assert.Positive(t, procs[1].run.Metrics().Compactions)
	assert.Positive(t, procs[2].run.Metrics().Compactions)
	st := readState(t, h.bk)
	compacted := map[int]int64{}
	for _, o := range st.Commit.Objects {
		if o.Kind == durable.KindCompacted {
			_, dup := compacted[o.Worker]
			assert.False(t, dup, "two compacted objects of worker %d", o.Worker)
			compacted[o.Worker] = o.LastEpoch
		}
	}
	require.Len(t, compacted, 3, "compacted objects of every process's worker: %v", st.Commit.Objects)
	assert.Equal(t, compacted[0], compacted[1])
	assert.Equal(t, compacted[0], compacted[2])
	requireModel(t, h.hist.at[8], readBack(t, h.bk, h.kgc))
	assertNoGarbage(t, h.bk)

	// Fast again, then rescaled from the compacted objects.
	procs, _ = h.start(3, 1, false, small)
	assert.Equal(t, []string{durable.ResumeFast}, kinds(procs[2].infos))
	requireModel(t, h.hist.at[8], clusterState(t, procs, h.kgc))
	h.mustEpochs(procs, 9, 10, g)
	h.finish(procs)
	procs, _ = h.start(2, 2, false)
	requireModel(t, h.hist.at[10], clusterState(t, procs, h.kgc))
	h.finish(procs)
}

// awaitCompactionsSettled waits until the leader r has been out of any
// compaction round, with its compaction count unchanged, for 300 ms.
func awaitCompactionsSettled(t *testing.T, r *durable.Run) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	quietSince, count := time.Now(), r.Metrics().Compactions
	for time.Since(quietSince) < 300*time.Millisecond {
		require.True(t, time.Now().Before(deadline), "compactions did not settle within %s", waitFor)
		if n := r.Metrics().Compactions; durable.CompactionRunning(r) || n != count {
			quietSince, count = time.Now(), n
		}
		time.Sleep(tick)
	}
}

// A follower's committed object that the backup lost is rebuilt by a
// cluster compaction with heal set.
func TestClusterHealsLostObjects(t *testing.T) {
	h := newClusterHarness(t)
	g := updatesGen(200, 0.3, false)
	procs, _ := h.start(2, 1, false)
	h.mustEpochs(procs, 1, 3, g)
	require.Eventually(t, func() bool { return procs[1].run.Committed() == 3 }, waitFor, tick)
	var lost string
	for _, o := range readState(t, h.bk).Commit.Objects {
		if o.Worker == 1 && o.LastEpoch == 1 {
			lost = o.Key
		}
	}
	require.NotEmpty(t, lost)
	require.NoError(t, h.bk.Delete(context.Background(), lost))
	h.mustEpochs(procs, 4, 5, g)
	h.finish(procs)
	assert.Positive(t, procs[0].run.Metrics().Heals)
	st := readState(t, h.bk)
	assert.Equal(t, int64(5), st.Commit.Epoch)
	for _, o := range st.Commit.Objects {
		assert.NotEqual(t, lost, o.Key)
	}
	requireModel(t, h.hist.at[5], readBack(t, h.bk, h.kgc))
}

// In a cluster an epoch whose batch is whole on every worker of every
// process is promoted to compacted state by the leader, from the marks the
// followers report; its deletions stay in the segments (whether the epoch
// is whole on every worker is known only after they are cut), and a
// restore or a resume never brings a deleted key back. One worker whose
// batch is not whole keeps the epoch plain.
func TestClusterWholeEpoch(t *testing.T) {
	cases := []struct {
		name string
		// plain is the worker whose batch of epoch 2 is not whole (-1: none).
		plain int
		// gone is the worker whose keys epoch 2 deletes, all of them (its
		// segment holds only deletions); empty the worker that never held
		// a key (its whole batch is empty: it cuts no segment). -1: none.
		gone, empty int
		promoted    bool
	}{
		{name: "every worker whole", plain: -1, gone: -1, empty: -1, promoted: true},
		{name: "a follower's worker not whole", plain: 3, gone: -1, empty: -1, promoted: false},
		{name: "a leader's worker not whole", plain: 0, gone: -1, empty: -1, promoted: false},
		{name: "a follower's worker deletes every key", plain: -1, gone: 2, empty: -1, promoted: true},
		{name: "a follower's worker without keys", plain: -1, gone: -1, empty: 3, promoted: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newClusterHarness(t)
			ctx := context.Background()
			// Every whole batch starts a new generation of the local
			// store, which replaces the old one once a follower learns
			// its epoch committed.
			generations := func(c *durable.Config) { c.GenerationMinRows = 1 }
			procs, _ := h.start(2, 2, false, generations)
			var all, keys []string
			for i := range 60 {
				all = append(all, fmt.Sprintf("k%02d", i))
			}
			owned := func(w int) map[string]bool {
				own := map[string]bool{}
				for _, r := range route(rowsOf(all, "", false), 4, h.kgc)[w] {
					own[r.Key] = true
				}
				require.NotEmpty(t, own)
				return own
			}
			skip := map[string]bool{}
			if c.empty >= 0 {
				skip = owned(c.empty)
			}
			for _, k := range all {
				if !skip[k] {
					keys = append(keys, k)
				}
			}
			h.mustEpochs(procs, 1, 1, func(int64) []rowbatch.Row { return rowsOf(keys, "one", false) })
			// Epoch 2: each worker's whole state, the first ten keys
			// deleted, and every key of the gone worker.
			del := map[string]bool{}
			for _, k := range keys[:10] {
				del[k] = true
			}
			if c.gone >= 0 {
				for k := range owned(c.gone) {
					del[k] = true
				}
			}
			var rows []rowbatch.Row
			for _, k := range keys {
				if del[k] {
					rows = append(rows, rowsOf([]string{k}, "", true)...)
				} else {
					rows = append(rows, rowsOf([]string{k}, "two", false)...)
				}
			}
			parts := route(rows, 4, h.kgc)
			h.m.apply(rows)
			h.hist.record(2, h.m)
			errs := parallel(2, func(p int) error {
				for w := 2 * p; w < 2*p+2; w++ {
					if _, err := procs[p].run.Write(ctx, w, rowbatch.NewBatch(2, parts[w], w != c.plain)); err != nil {
						return err
					}
				}
				for w := 2 * p; w < 2*p+2; w++ {
					if err := procs[p].run.CloseEpoch(w, 2); err != nil {
						return err
					}
				}
				return nil
			})
			require.NoError(t, errors.Join(errs...))
			h.mustEpochs(procs, 3, 3, func(int64) []rowbatch.Row { return rowsOf(keys[20:30], "three", false) })
			h.finish(procs)
			st := readState(t, h.bk)
			compacted := 0
			for _, o := range st.Commit.Objects {
				if o.Kind == durable.KindCompacted {
					compacted++
					assert.Equal(t, int64(2), o.LastEpoch, o.Key)
				} else if c.promoted {
					assert.Equal(t, int64(3), o.FirstEpoch, "only epoch 3 is left a segment: %s", o.Key)
				}
			}
			if c.promoted {
				assert.Equal(t, int64(1), procs[0].run.Metrics().WholeEpochs)
				want := 4
				if c.empty >= 0 {
					want = 3
				}
				assert.Equal(t, want, compacted)
			} else {
				assert.Zero(t, procs[0].run.Metrics().WholeEpochs)
				assert.Zero(t, compacted)
			}
			requireModel(t, h.hist.at[3], readBack(t, h.bk, h.kgc))
			// A fast resume, and a full one on one process of three workers.
			procs, _ = h.start(2, 2, false, generations)
			assert.Equal(t, []string{durable.ResumeFast, durable.ResumeFast}, kinds(procs[1].infos))
			requireModel(t, h.hist.at[3], clusterState(t, procs, h.kgc))
			h.finish(procs)
			procs, _ = h.start(1, 3, false)
			requireModel(t, h.hist.at[3], clusterState(t, procs, h.kgc))
			h.finish(procs)
		})
	}
}

// The agreement at start: a follower refuses another committed epoch,
// another flow layout, a silent leader; the leader refuses a bad split of
// the workers; and neither waits for its timeout when the other failed.
func TestClusterAgreement(t *testing.T) {
	t.Run("different backup", func(t *testing.T) {
		h := newClusterHarness(t)
		procs, _ := h.start(1, 2, true)
		h.mustEpochs(procs, 1, 3, updatesGen(50, 0.5, false))
		h.finish(procs)
		other, err := dirbackup.New(t.TempDir(), nil)
		require.NoError(t, err)
		net := newFakeNet(2)
		start := time.Now()
		errs := parallel(2, func(p int) error {
			_, err := openProc(h.config(net, p, 2, 1, func(c *durable.Config) {
				c.StartTimeout = 10 * time.Second
				if p == 1 {
					c.Backup = other
				}
			}))
			return err
		})
		require.Error(t, errs[1])
		assert.Contains(t, errs[1].Error(), "process 0 resumes from committed epoch 3 but this process reads epoch 0 from backup")
		assert.Contains(t, errs[1].Error(), "every process must use the same backup")
		require.Error(t, errs[0])
		assert.Contains(t, errs[0].Error(), "process 1 failed")
		assert.Less(t, time.Since(start), 5*time.Second, "the leader learns of the refusal at once")
	})
	t.Run("different worker count", func(t *testing.T) {
		h := newClusterHarness(t)
		net := newFakeNet(2)
		errs := parallel(2, func(p int) error {
			_, err := openProc(h.config(net, p, 2, 1, func(c *durable.Config) {
				if p == 1 {
					c.WorkerCount = 3
				}
			}))
			return err
		})
		require.Error(t, errs[1])
		assert.Contains(t, errs[1].Error(), "process 0 runs 2 workers, not 3")
		require.Error(t, errs[0])
	})
	t.Run("leader silent", func(t *testing.T) {
		h := newClusterHarness(t)
		net := newFakeNet(2)
		start := time.Now()
		_, err := durable.Open(context.Background(), h.config(net, 1, 2, 1, func(c *durable.Config) { c.StartTimeout = 300 * time.Millisecond }))
		require.Error(t, err)
		assert.ErrorIs(t, err, durable.ErrCluster)
		assert.Contains(t, err.Error(), "StartTimeout")
		assert.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)
	})
	t.Run("follower silent at start", func(t *testing.T) {
		h := newClusterHarness(t)
		net := newFakeNet(2)
		_, err := openProc(h.config(net, 0, 2, 1, func(c *durable.Config) { c.StartTimeout = 300 * time.Millisecond }))
		require.Error(t, err)
		assert.Contains(t, err.Error(), "0 of 1 ready")
		assert.Empty(t, list(t, h.bk, "executions/"), "no execution recorded")
	})
	t.Run("overlapping workers", func(t *testing.T) {
		h := newClusterHarness(t)
		net := newFakeNet(2)
		errs := parallel(2, func(p int) error {
			_, err := openProc(h.config(net, p, 2, 2, func(c *durable.Config) { c.FirstWorker = p }))
			return err
		})
		require.Error(t, errs[0])
		assert.Contains(t, errs[0].Error(), "not workers 0..3 once each")
		require.Error(t, errs[1])
		assert.Contains(t, errs[1].Error(), "process 0 failed")
		assert.Empty(t, list(t, h.bk, "executions/"))
	})
	t.Run("workers not hosted here", func(t *testing.T) {
		h := newClusterHarness(t)
		procs, _ := h.start(2, 2, false)
		ctx := context.Background()
		run := procs[1].run
		_, err := run.Restore(ctx, 0)
		assert.ErrorContains(t, err, "worker 0 is not hosted by process 1")
		_, err = run.Write(ctx, 1, rowbatch.NewBatch(1, nil, false))
		assert.ErrorContains(t, err, "not hosted")
		assert.ErrorContains(t, run.CloseEpoch(4, 1), "not hosted")
		assert.Nil(t, run.Store(0))
		assert.NotNil(t, run.Store(2))
		assert.Nil(t, run.Worker(1).Store())
		h.finish(procs)
	})
}

// A message this run cannot use (of another execution, malformed, of an
// unknown type) fails the run with a clear error, and the other process
// stops too.
func TestClusterRefusesBadMessages(t *testing.T) {
	cases := []struct {
		name    string
		payload string
		want    string
	}{
		{"another execution", `{"v":2,"type":"committed","execution":7,"record":{"epoch":1,"flow_id":"flow-a"}}`, "fenced out: process 0 sent a \"committed\" message of execution 7, but this run is execution 0"},
		{"malformed", `not json`, "malformed message from process 0"},
		{"unknown type", `{"v":2,"type":"gossip","execution":0}`, `unknown type "gossip"`},
		{"other version", `{"v":9,"type":"committed","execution":0}`, "of version 9"},
		{"not taken while running", `{"v":2,"type":"agree","execution":0,"flow_id":"flow-a","resume_epoch":1,"worker_count":2,"key_group_count":16,"processes":2}`, `"agree" message, which process 1 does not take`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newClusterHarness(t)
			procs, net := h.start(2, 1, false)
			h.mustEpochs(procs, 1, 1, updatesGen(40, 1, false))
			net.inject(0, 1, []byte(c.payload))
			require.Eventually(t, func() bool { return procs[1].run.Err() != nil }, waitFor, tick)
			assert.Contains(t, procs[1].run.Err().Error(), c.want)
			assert.ErrorIs(t, procs[1].run.Err(), durable.ErrCluster)
			require.Eventually(t, func() bool { return procs[0].run.Err() != nil }, waitFor, tick)
			assert.Contains(t, procs[0].run.Err().Error(), "process 1 failed")
			errs := parallel(2, func(p int) error { return procs[p].run.Finish(false) })
			assert.Error(t, errs[0])
			assert.Error(t, errs[1])
		})
	}
}

// The leader refuses a follower's report that marks another process's
// worker whole: promoting the epoch on it could drop that worker's state.
func TestClusterRefusesForeignWholeMarks(t *testing.T) {
	h := newClusterHarness(t)
	procs, net := h.start(2, 1, false)
	h.mustEpochs(procs, 1, 1, updatesGen(40, 1, false))
	require.Eventually(t, func() bool { return procs[0].run.Committed() == 1 }, waitFor, tick)
	net.inject(1, 0, []byte(`{"v":2,"type":"uploaded","execution":0,"epoch":2,"whole":[0,1]}`))
	require.Eventually(t, func() bool { return procs[0].run.Err() != nil }, waitFor, tick)
	assert.Contains(t, procs[0].run.Err().Error(), "process 1 (workers 1..1) marked worker 0's batch of epoch 2 whole")
	assert.ErrorIs(t, procs[0].run.Err(), durable.ErrCluster)
	// The follower learns of the leader's failure on its own time; a
	// Finish before that has nothing of its own left to wait for (its
	// last closed epoch is committed) and returns nil.
	require.Eventually(t, func() bool { return procs[1].run.Err() != nil }, waitFor, tick)
	errs := parallel(2, func(p int) error { return procs[p].run.Finish(false) })
	assert.Error(t, errs[0])
	assert.Error(t, errs[1])
	assert.Equal(t, int64(1), readState(t, h.bk).Commit.Epoch)
}

// A cluster of one process is a run of its own that speaks the protocol
// to nobody.
func TestClusterOfOne(t *testing.T) {
	h := newClusterHarness(t)
	g := updatesGen(100, 0.3, true)
	procs, _ := h.start(1, 2, false)
	h.mustEpochs(procs, 1, 4, g)
	h.finish(procs)
	requireModel(t, h.hist.at[4], readBack(t, h.bk, h.kgc))
}

// In immediate mode a follower reports every segment of an epoch (one per
// batch) and the leader's record names them all.
func TestClusterImmediateMode(t *testing.T) {
	h := newClusterHarness(t)
	g := updatesGen(200, 0.25, true)
	immediate := func(c *durable.Config) { c.Mode = durable.SnapshotImmediate }
	procs, _ := h.start(2, 2, false, immediate)
	h.mustEpochs(procs, 1, 5, g)
	h.finish(procs)
	requireCovered(t, h.bk, 4, h.kgc, 1, rowsOfEpochs(g, 1, 5))
	requireModel(t, h.hist.at[5], readBack(t, h.bk, h.kgc))
}

// The leader's Finish waits for a follower that closes its last epochs
// after it (the follower is slower), and commits them.
func TestClusterLeaderFinishWaitsForFollowers(t *testing.T) {
	h := newClusterHarness(t)
	g := updatesGen(100, 0.5, false)
	procs, _ := h.start(2, 1, false)
	rows := rowsOfEpochs(g, 1, 3)
	for e := int64(1); e <= 3; e++ {
		h.m.apply(rows[e])
		h.hist.record(e, h.m)
	}
	ctx := context.Background()
	errs := parallel(2, func(p int) error {
		if p == 1 {
			time.Sleep(300 * time.Millisecond)
		}
		run := procs[p].run
		for e := int64(1); e <= 3; e++ {
			if _, err := run.Write(ctx, p, rowbatch.NewBatch(e, route(rows[e], 2, h.kgc)[p], false)); err != nil {
				return err
			}
			if err := run.CloseLastEpoch(p, e); err != nil {
				return err
			}
		}
		return run.Finish(false)
	})
	require.NoError(t, errors.Join(errs...))
	assert.Equal(t, int64(3), procs[0].run.Committed())
	assert.Equal(t, int64(3), procs[1].run.Committed())
	requireModel(t, h.hist.at[3], readBack(t, h.bk, h.kgc))
}

// A leader that aborts commits only what every worker closed, and a
// follower that did not abort learns that its last epoch never committed.
func TestClusterLeaderAborts(t *testing.T) {
	h := newClusterHarness(t)
	g := updatesGen(100, 0.5, false)
	procs, _ := h.start(2, 1, false)
	h.mustEpochs(procs, 1, 2, g)
	ctx := context.Background()
	// Epoch 3 is closed by the follower only.
	rows := route(g(3), 2, h.kgc)
	_, err := procs[1].run.Write(ctx, 1, rowbatch.NewBatch(3, rows[1], false))
	require.NoError(t, err)
	require.NoError(t, procs[1].run.CloseLastEpoch(1, 3))
	require.Eventually(t, func() bool { return procs[0].run.Committed() == 2 }, waitFor, tick)
	require.NoError(t, procs[0].run.Finish(true))
	err = procs[1].run.Finish(false)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "process 0 finished")
	assert.Equal(t, int64(2), readState(t, h.bk).Commit.Epoch)
	requireModel(t, h.hist.at[2], readBack(t, h.bk, h.kgc))
}

// The cluster closing once the leader finished (in good order: what was
// sent is delivered first) does not fail a follower that is finishing.
func TestClusterClosesAfterTheLeaderFinished(t *testing.T) {
	for i := range 3 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			h := newClusterHarness(t)
			procs, net := h.start(2, 1, false)
			h.mustEpochs(procs, 1, 3, updatesGen(60, 0.5, false))
			errs := parallel(2, func(p int) error {
				err := procs[p].run.Finish(false)
				if p == 0 {
					net.fail(errors.New("closed"))
				}
				return err
			})
			require.NoError(t, errors.Join(errs...))
			assert.Equal(t, int64(3), procs[1].run.Committed())
		})
	}
}
