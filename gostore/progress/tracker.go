package progress

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// Report is one process's view at a quiescent point of its driver loop.
type Report struct {
	// Epoch and Phase name the decision this report is for. Phase 0 decides
	// the close of Epoch; later phases follow the end-of-input activations.
	Epoch int64
	Phase int
	// Ready means this process wants (Epoch, Phase) decided and is passive
	// from now on for it: it polls no source and fires no timer, and only
	// processes the data messages it receives. Ready may not be withdrawn.
	Ready bool
	// Done lists the input step indexes whose partitions on this process
	// have all ended. It only grows; order and duplicates do not matter.
	Done []int
	// Sent and Received count data messages to and from other processes,
	// cumulative since the start. Received counts a message once the driver
	// has taken it.
	Sent, Received int64
}

// Decision closes (Epoch, Phase): nothing in flight, every process ready.
type Decision struct {
	// Epoch and Phase name the decided key, the one reported.
	Epoch int64
	Phase int
	// Done lists the input steps ended on every process (the intersection
	// of their Done at the decision), sorted; empty, never nil.
	Done []int
}

// key orders the decisions: (epoch, phase) lexicographically.
type key struct {
	epoch int64
	phase int
}

func (k key) less(o key) bool {
	return k.epoch < o.epoch || (k.epoch == o.epoch && k.phase < o.phase)
}

func (k key) String() string { return fmt.Sprintf("(epoch %d, phase %d)", k.epoch, k.phase) }

// outgoing is a control message waiting to be sent once the lock is free.
type outgoing struct {
	to      int
	kind    byte
	payload []byte
}

// heldProbe is a probe a non-leader has not answered yet.
type heldProbe struct {
	key  key
	wave int
}

// Tracker is one process's part of the protocol; process 0 leads.
//
// Report is called by the driver's thread; Deliver by whatever goroutines
// receive control messages, possibly concurrently with Report. Both are
// non-blocking apart from the send callback.
type Tracker struct {
	index, count int
	send         func(to int, payload []byte) error
	wake         func()
	now          func() time.Time

	// sendMu is taken before mu is released whenever a call has messages
	// to send, so messages leave in the order the state changes that made
	// them happened (FIFO per pair depends on it).
	sendMu sync.Mutex

	mu  sync.Mutex
	err error // the first error; every later call returns it

	reported       bool  // a Report was made
	cur            key   // key of the last Report
	ready          bool  // the last Report for cur was Ready
	sent, received int64 // counters of the last Report
	done           []int // Done of the last Report, sorted

	decided bool     // last holds a decision
	last    Decision // the last decision known here
	lastKey key

	probe *heldProbe // non-leader: the probe not answered yet
	lead  *leader    // process 0 only

	st stats

	// Test-only knobs, set by the package's tests right after New.
	onDecide   func(Decision) // called under mu at the instant the leader decides
	singleWave bool           // deliberately wrong: decide after one wave
}

// New returns process index's tracker in a cluster of count processes.
// send delivers a control message to another process's Tracker.Deliver,
// FIFO per pair; it should queue rather than block, and is never called
// for count == 1. wake (may be nil) is called after Deliver received
// something a waiting driver should react to: a probe to answer, a decision.
//
// An invalid configuration is not a panic: every call then returns the
// error.
func New(index, count int, send func(to int, payload []byte) error, wake func()) *Tracker {
	t := &Tracker{index: index, count: count, send: send, wake: wake, now: time.Now}
	switch {
	case count < 1:
		t.err = fmt.Errorf("progress: a cluster of %d processes (at least 1 needed)", count)
	case index < 0 || index >= count:
		t.err = fmt.Errorf("progress: process index %d outside a cluster of %d", index, count)
	case count > 1 && send == nil:
		t.err = fmt.Errorf("progress: process %d of %d: no send function", index, count)
	}
	if t.wake == nil {
		t.wake = func() {}
	}
	if index == 0 && t.err == nil {
		t.lead = newLeader(count)
	}
	return t
}

func (t *Tracker) errorf(format string, args ...any) error {
	return fmt.Errorf("progress: process %d of %d: %w", t.index, t.count, fmt.Errorf(format, args...))
}

// Report gives this process's view at a quiescent point of its driver loop.
// It never blocks on other processes: it returns the decision for
// (r.Epoch, r.Phase) and true once that decision is known here, and false
// while it is not (the driver keeps processing what it receives and reports
// again, when woken or after its next activation). A Ready report is where
// this process answers the leader's probes.
//
// Keys go forward only: a report for a later key than the previous one is
// an error until the previous key's decision is known here, and so is a
// report whose counters or Done went back, or that withdraws Ready.
func (t *Tracker) Report(r Report) (Decision, bool, error) {
	t.mu.Lock()
	d, ok, out, err := t.report(r)
	if err := t.finish(out, false, err); err != nil {
		return Decision{}, false, err
	}
	return d, ok, nil
}

// Deliver takes a control message from process from's Tracker. Messages
// of keys at or before the last decision known here are ignored; a
// malformed or impossible message is an error, after which every call
// returns it.
func (t *Tracker) Deliver(from int, payload []byte) error {
	t.mu.Lock()
	out, wake, err := t.deliver(from, payload)
	return t.finish(out, wake, err)
}

// Stats returns this tracker's figures.
func (t *Tracker) Stats() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.st.snapshot(t.lead != nil)
}

// finish releases mu (held by the caller), then sends out in order and
// calls wake if asked.
func (t *Tracker) finish(out []outgoing, wake bool, err error) error {
	if err != nil {
		if t.err == nil {
			t.err = err
		}
		err = t.err
		t.mu.Unlock()
		return err
	}
	if len(out) == 0 {
		t.mu.Unlock()
		if wake {
			t.wake()
		}
		return nil
	}
	t.sendMu.Lock()
	t.mu.Unlock()
	for _, o := range out {
		if e := t.send(o.to, o.payload); e != nil {
			err = t.errorf("sending a %s to process %d: %w", kindName(o.kind), o.to, e)
			break
		}
	}
	t.sendMu.Unlock()
	if err != nil {
		t.mu.Lock()
		if t.err == nil {
			t.err = err
		}
		err = t.err
		t.mu.Unlock()
		return err
	}
	if wake {
		t.wake()
	}
	return nil
}

// report does Report's work under mu.
func (t *Tracker) report(r Report) (Decision, bool, []outgoing, error) {
	if t.err != nil {
		return Decision{}, false, nil, t.err
	}
	k := key{r.Epoch, r.Phase}
	if r.Epoch < 0 || r.Phase < 0 {
		return Decision{}, false, nil, t.errorf("report for %v: negative epoch or phase", k)
	}
	if r.Sent < 0 || r.Received < 0 {
		return Decision{}, false, nil, t.errorf("report for %v: negative counters (sent %d, received %d)", k, r.Sent, r.Received)
	}
	done, err := normalizeDone(r.Done)
	if err != nil {
		return Decision{}, false, nil, t.errorf("report for %v: %w", k, err)
	}
	if t.reported {
		switch {
		case k.less(t.cur):
			return Decision{}, false, nil, t.errorf("report for %v after one for %v: keys only go forward", k, t.cur)
		case t.cur.less(k) && !(t.decided && t.lastKey == t.cur):
			return Decision{}, false, nil, t.errorf("report for %v before %v was decided", k, t.cur)
		case k == t.cur && t.ready && !r.Ready:
			return Decision{}, false, nil, t.errorf("report for %v withdraws Ready (Ready means passive until the decision)", k)
		case r.Sent < t.sent || r.Received < t.received:
			return Decision{}, false, nil, t.errorf("report for %v: counters went back (sent %d -> %d, received %d -> %d)",
				k, t.sent, r.Sent, t.received, r.Received)
		case !isSubset(t.done, done):
			return Decision{}, false, nil, t.errorf("report for %v: Done %v drops steps of the earlier %v", k, done, t.done)
		}
	}
	fresh := !t.reported || k != t.cur
	t.reported, t.cur, t.ready = true, k, r.Ready
	t.sent, t.received, t.done = r.Sent, r.Received, done

	var out []outgoing
	if !(t.decided && t.lastKey == k) {
		if t.lead != nil {
			out = t.leaderReport(fresh)
		} else if out, err = t.followerReport(); err != nil {
			return Decision{}, false, nil, err
		}
	}
	if t.decided && t.lastKey == k {
		return t.decision(), true, out, nil
	}
	return Decision{}, false, out, nil
}

// decision returns a copy of the last decision the caller may keep.
func (t *Tracker) decision() Decision {
	d := t.last
	d.Done = slices.Clone(d.Done)
	if d.Done == nil {
		d.Done = []int{}
	}
	return d
}

// followerReport answers the held probe if this report may: Ready, for
// the probe's key.
func (t *Tracker) followerReport() ([]outgoing, error) {
	p := t.probe
	if p == nil {
		return nil, nil
	}
	if p.key.less(t.cur) {
		return nil, t.errorf("reports %v, but never answered the probe of %v wave %d", t.cur, p.key, p.wave)
	}
	if t.cur.less(p.key) {
		// The decision of cur would have come before this probe (FIFO):
		// the leader went through other keys than this process.
		return nil, t.errorf("reports %v, still undecided, but the leader probes %v", t.cur, p.key)
	}
	if p.key != t.cur || !t.ready {
		return nil, nil
	}
	t.probe = nil
	t.st.waves++
	m := message{kind: kindReply, key: p.key, wave: p.wave, sent: t.sent, received: t.received, done: t.done}
	return []outgoing{{to: 0, kind: kindReply, payload: encode(m)}}, nil
}

// stale reports whether k is at or before the last decision known here.
func (t *Tracker) stale(k key) bool {
	return t.decided && !t.lastKey.less(k)
}

// deliver does Deliver's work under mu; wake says whether the driver has
// something new to react to.
func (t *Tracker) deliver(from int, payload []byte) (out []outgoing, wake bool, err error) {
	if t.err != nil {
		return nil, false, t.err
	}
	if from < 0 || from >= t.count || from == t.index {
		return nil, false, t.errorf("control message from process %d", from)
	}
	m, err := decode(payload)
	if err != nil {
		return nil, false, t.errorf("from process %d: %w", from, err)
	}
	if t.lead != nil {
		if m.kind != kindReply {
			return nil, false, t.errorf("unexpected %s from process %d: process 0 leads and only takes replies", kindName(m.kind), from)
		}
		return t.leaderDeliver(from, m)
	}
	if from != 0 {
		return nil, false, t.errorf("unexpected %s from process %d: only the leader, process 0, sends control messages here", kindName(m.kind), from)
	}
	if m.kind == kindReply {
		return nil, false, t.errorf("unexpected reply from process 0: only the leader takes replies")
	}
	if t.stale(m.key) {
		return nil, false, nil
	}
	if m.kind == kindProbe {
		return nil, true, t.followerProbe(m)
	}
	return nil, true, t.followerDecision(m)
}

// followerProbe keeps a probe (not stale) until a Ready report for its key.
func (t *Tracker) followerProbe(m message) error {
	if p := t.probe; p != nil {
		return t.errorf("probe of %v wave %d while the probe of %v wave %d is unanswered", m.key, m.wave, p.key, p.wave)
	}
	if t.reported && m.key.less(t.cur) {
		return t.errorf("probe of %v wave %d, but this process already reports %v", m.key, m.wave, t.cur)
	}
	if t.reported && t.cur.less(m.key) && !(t.decided && t.lastKey == t.cur) {
		return t.errorf("probe of %v wave %d while this process waits for the decision of %v", m.key, m.wave, t.cur)
	}
	t.probe = &heldProbe{key: m.key, wave: m.wave}
	return nil
}

// followerDecision records a decision (not stale) for the reported key.
func (t *Tracker) followerDecision(m message) error {
	if !t.reported || t.cur != m.key {
		return t.errorf("decision for %v, which this process has not reported (last %v)", m.key, t.cur)
	}
	if p := t.probe; p != nil && !m.key.less(p.key) {
		return t.errorf("decision for %v while the probe of %v wave %d is unanswered", m.key, p.key, p.wave)
	}
	t.decided, t.lastKey = true, m.key
	t.last = Decision{Epoch: m.key.epoch, Phase: m.key.phase, Done: m.done}
	t.st.decisions++
	return nil
}

// normalizeDone returns a sorted copy of done without duplicates.
func normalizeDone(done []int) ([]int, error) {
	out := slices.Clone(done)
	slices.Sort(out)
	out = slices.Compact(out)
	if len(out) > 0 && out[0] < 0 {
		return nil, fmt.Errorf("negative input step index %d in Done", out[0])
	}
	if len(out) > maxDoneWire {
		return nil, fmt.Errorf("%d input steps in Done (at most %d)", len(out), maxDoneWire)
	}
	return out, nil
}

// isSubset reports whether every element of sorted a is in sorted b.
func isSubset(a, b []int) bool {
	j := 0
	for _, x := range a {
		for j < len(b) && b[j] < x {
			j++
		}
		if j == len(b) || b[j] != x {
			return false
		}
	}
	return true
}
