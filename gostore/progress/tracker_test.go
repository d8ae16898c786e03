package progress

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// outbox records what a tracker sends, decoded.
type outbox struct {
	msgs  []addressed
	wakes int
}

type addressed struct {
	to int
	m  message
}

func (o *outbox) send(to int, p []byte) error {
	m, err := decode(p)
	if err != nil {
		return err
	}
	o.msgs = append(o.msgs, addressed{to, m})
	return nil
}

func (o *outbox) wake() { o.wakes++ }

// take returns the messages sent since the last take.
func (o *outbox) take() []addressed {
	m := o.msgs
	o.msgs = nil
	return m
}

func newTest(t *testing.T, index, count int) (*Tracker, *outbox) {
	t.Helper()
	o := &outbox{}
	return New(index, count, o.send, o.wake), o
}

func probeMsg(e int64, p, wave int) []byte {
	return encode(message{kind: kindProbe, key: key{e, p}, wave: wave})
}

func replyMsg(e int64, p, wave int, sent, received int64, done ...int) []byte {
	if done == nil {
		done = []int{}
	}
	return encode(message{kind: kindReply, key: key{e, p}, wave: wave, sent: sent, received: received, done: done})
}

func decisionMsg(e int64, p int, done ...int) []byte {
	if done == nil {
		done = []int{}
	}
	return encode(message{kind: kindDecision, key: key{e, p}, done: done})
}

func TestSingleProcessDecidesOnAReadyReport(t *testing.T) {
	tr := New(0, 1, nil, nil)
	_, ok, err := tr.Report(Report{Epoch: 4, Ready: false, Done: []int{2}})
	require.NoError(t, err)
	assert.False(t, ok, "not ready: no decision")
	d, ok, err := tr.Report(Report{Epoch: 4, Ready: true, Done: []int{2, 1}})
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, Decision{Epoch: 4, Phase: 0, Done: []int{1, 2}}, d)
	// Asking again returns the same decision; the next phase decides too.
	d2, ok, err := tr.Report(Report{Epoch: 4, Ready: true, Done: []int{1, 2}})
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, d, d2)
	d, ok, err = tr.Report(Report{Epoch: 4, Phase: 1, Ready: true, Done: []int{1, 2}})
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, 1, d.Phase)
	st := tr.Stats()
	assert.True(t, st.Leader)
	assert.EqualValues(t, 2, st.Decisions)
	assert.Equal(t, 2, st.LastWaves)
	assert.Equal(t, 1, st.CloseSamples, "only phase 0 is an epoch close")
}

func TestSingleProcessWaitsForEqualCounters(t *testing.T) {
	tr := New(0, 1, nil, nil)
	_, ok, err := tr.Report(Report{Epoch: 0, Ready: true, Sent: 1})
	require.NoError(t, err)
	assert.False(t, ok)
	_, ok, err = tr.Report(Report{Epoch: 0, Ready: true, Sent: 1, Received: 1})
	require.NoError(t, err)
	assert.True(t, ok)
}

func TestLeaderDecidesAfterTwoStableWaves(t *testing.T) {
	tr, o := newTest(t, 0, 2)
	_, ok, err := tr.Report(Report{Epoch: 1, Ready: true, Sent: 3, Received: 2})
	require.NoError(t, err)
	require.False(t, ok)
	assert.Equal(t, []addressed{{1, message{kind: kindProbe, key: key{1, 0}, wave: 1}}}, o.take())

	require.NoError(t, tr.Deliver(1, replyMsg(1, 0, 1, 2, 3)))
	assert.Equal(t, 1, o.wakes, "a new wave: the leader has a probe of its own to answer")
	assert.Equal(t, []addressed{{1, message{kind: kindProbe, key: key{1, 0}, wave: 2}}}, o.take())

	require.NoError(t, tr.Deliver(1, replyMsg(1, 0, 2, 2, 3)))
	assert.Empty(t, o.take(), "the leader's own reply to wave 2 is missing")
	d, ok, err := tr.Report(Report{Epoch: 1, Ready: true, Sent: 3, Received: 2})
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, Decision{Epoch: 1, Done: []int{}}, d)
	assert.Equal(t, []addressed{{1, message{kind: kindDecision, key: key{1, 0}, done: []int{}}}}, o.take())
	st := tr.Stats()
	assert.EqualValues(t, 2, st.Waves)
	assert.Equal(t, 2, st.LastWaves)
}

func TestLeaderKeepsWavingWhileCountersMoveOrDisagree(t *testing.T) {
	cases := []struct {
		name   string
		wave1  [2]int64 // follower's (sent, received) in wave 1
		wave2  [2]int64
		leader [2]int64 // leader's, the same in both waves
	}{
		{"follower received between waves", [2]int64{0, 0}, [2]int64{0, 1}, [2]int64{1, 0}},
		{"follower sent between waves", [2]int64{1, 1}, [2]int64{2, 1}, [2]int64{1, 1}},
		{"stable but a message in flight", [2]int64{1, 0}, [2]int64{1, 0}, [2]int64{0, 0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr, o := newTest(t, 0, 2)
			rep := Report{Epoch: 0, Ready: true, Sent: c.leader[0], Received: c.leader[1]}
			_, _, err := tr.Report(rep)
			require.NoError(t, err)
			require.NoError(t, tr.Deliver(1, replyMsg(0, 0, 1, c.wave1[0], c.wave1[1])))
			require.NoError(t, tr.Deliver(1, replyMsg(0, 0, 2, c.wave2[0], c.wave2[1])))
			_, ok, err := tr.Report(rep)
			require.NoError(t, err)
			assert.False(t, ok)
			msgs := o.take()
			last := msgs[len(msgs)-1]
			assert.Equal(t, message{kind: kindProbe, key: key{0, 0}, wave: 3}, last.m)
		})
	}
}

func TestLeaderDecisionCarriesTheDoneIntersection(t *testing.T) {
	cases := []struct {
		name   string
		leader []int   // the leader's Report.Done, as given
		others [][]int // processes 1 and 2, sorted as on the wire
		want   []int
	}{
		{"none ended", nil, [][]int{{}, {}}, []int{}},
		{"ended everywhere", []int{0, 1}, [][]int{{0, 1}, {0, 1}}, []int{0, 1}},
		{"ended on some processes only", []int{3, 1, 2, 3}, [][]int{{2, 3}, {2, 3, 5}}, []int{2, 3}},
		{"disjoint", []int{0}, [][]int{{1}, {2}}, []int{}},
		{"not on the leader", nil, [][]int{{4}, {4}}, []int{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr, o := newTest(t, 0, 3)
			rep := Report{Epoch: 2, Phase: 1, Ready: true, Done: c.leader}
			_, _, err := tr.Report(rep)
			require.NoError(t, err)
			for wave := 1; wave <= 2; wave++ {
				for i, done := range c.others {
					require.NoError(t, tr.Deliver(i+1, replyMsg(2, 1, wave, 0, 0, done...)))
				}
			}
			d, ok, err := tr.Report(rep)
			require.NoError(t, err)
			require.True(t, ok)
			assert.Equal(t, c.want, d.Done)
			msgs := o.take()
			require.Len(t, msgs, 6) // probes of waves 1 and 2, two decisions
			for _, m := range msgs[4:] {
				assert.Equal(t, message{kind: kindDecision, key: key{2, 1}, done: c.want}, m.m)
			}
		})
	}
}

func TestFollowerAnswersProbesOnlyFromReadyReportsOfTheirKey(t *testing.T) {
	tr, o := newTest(t, 1, 3)
	// A fast leader: the probe of (3, 0) arrives before the first report.
	require.NoError(t, tr.Deliver(0, probeMsg(3, 0, 1)))
	assert.Equal(t, 1, o.wakes)
	assert.Empty(t, o.take(), "never answered from Deliver")
	_, _, err := tr.Report(Report{Epoch: 3, Ready: false, Sent: 1})
	require.NoError(t, err)
	assert.Empty(t, o.take(), "not ready: the probe is kept")
	_, ok, err := tr.Report(Report{Epoch: 3, Ready: true, Sent: 2, Received: 1, Done: []int{0}})
	require.NoError(t, err)
	assert.False(t, ok)
	assert.Equal(t, []addressed{{0, message{kind: kindReply, key: key{3, 0}, wave: 1, sent: 2, received: 1, done: []int{0}}}}, o.take())
	_, _, err = tr.Report(Report{Epoch: 3, Ready: true, Sent: 2, Received: 1, Done: []int{0}})
	require.NoError(t, err)
	assert.Empty(t, o.take(), "one reply per probe")

	require.NoError(t, tr.Deliver(0, probeMsg(3, 0, 2)))
	require.ErrorContains(t, tr.Deliver(0, decisionMsg(3, 0)), "wave 2 is unanswered",
		"a decision can only follow this process's reply to the last wave")
}

func TestFollowerMessageHandling(t *testing.T) {
	type step struct {
		report  *Report // a report, or
		from    int     // a delivery from this process of
		payload []byte
		wantErr string // "" for no error
		wantOK  bool   // report: decided
		wantOut int    // messages sent by this step
		wake    bool   // delivery: wake called
	}
	rep := func(e int64, p int, ready bool) *Report { return &Report{Epoch: e, Phase: p, Ready: ready} }
	cases := []struct {
		name  string
		steps []step
	}{
		{"future probe kept until its key is reported", []step{
			{payload: probeMsg(7, 2, 1), wake: true},
			{report: rep(7, 2, false)},
			{report: rep(7, 2, false)},
			{report: rep(7, 2, true), wantOut: 1},
			{report: rep(7, 2, true)},
		}},
		{"probe for the next key arrives before the driver saw the decision", []step{
			{payload: probeMsg(1, 0, 1), wake: true},
			{report: rep(1, 0, true), wantOut: 1},
			{payload: decisionMsg(1, 0), wake: true},
			{payload: probeMsg(1, 1, 1), wake: true},
			{report: rep(1, 0, true), wantOK: true},
			{report: rep(1, 1, true), wantOut: 1},
		}},
		{"stale probes and decisions are ignored", []step{
			{payload: probeMsg(1, 0, 1), wake: true},
			{report: rep(1, 0, true), wantOut: 1},
			{payload: decisionMsg(1, 0), wake: true},
			{payload: probeMsg(1, 0, 2)},
			{payload: probeMsg(0, 5, 1)},
			{payload: decisionMsg(1, 0)},
			{payload: decisionMsg(0, 3)},
			{report: rep(1, 0, true), wantOK: true},
		}},
		{"decisions arrive in order: one for a later key is an error", []step{
			{payload: probeMsg(1, 0, 1), wake: true},
			{report: rep(1, 0, true), wantOut: 1},
			{payload: decisionMsg(1, 1), wantErr: "decision for (epoch 1, phase 1), which this process has not reported"},
		}},
		{"second probe while one is unanswered", []step{
			{payload: probeMsg(1, 0, 1), wake: true},
			{payload: probeMsg(1, 0, 2), wantErr: "is unanswered"},
		}},
		{"decision while a probe is unanswered", []step{
			{report: rep(1, 0, false)},
			{payload: probeMsg(1, 0, 1), wake: true},
			{payload: decisionMsg(1, 0), wantErr: "probe of (epoch 1, phase 0) wave 1 is unanswered"},
		}},
		{"probe for a key already passed", []step{
			{report: rep(2, 0, false)},
			{payload: probeMsg(1, 0, 1), wantErr: "already reports"},
		}},
		{"probe past the key this process waits on: the leader went elsewhere", []step{
			{report: rep(1, 0, true)},
			{payload: probeMsg(2, 0, 1), wantErr: "waits for the decision of (epoch 1, phase 0)"},
		}},
		{"first report before the key the leader probes", []step{
			{payload: probeMsg(2, 0, 1), wake: true},
			{report: rep(1, 0, true), wantErr: "still undecided, but the leader probes (epoch 2, phase 0)"},
		}},
		{"moving past a probed key", []step{
			{payload: probeMsg(1, 0, 1), wake: true},
			{report: rep(2, 0, true), wantErr: "never answered the probe"},
		}},
		{"malformed payload", []step{
			{payload: []byte{wireVersion, kindProbe, 1}, wantErr: "truncated"},
		}},
		{"reply at a follower", []step{
			{payload: replyMsg(1, 0, 1, 0, 0), wantErr: "only the leader takes replies"},
		}},
		{"control message from a follower", []step{
			{from: 2, payload: probeMsg(1, 0, 1), wantErr: "only the leader, process 0"},
		}},
		{"control message from itself", []step{
			{from: 1, payload: probeMsg(1, 0, 1), wantErr: "from process 1"},
		}},
		{"control message from outside the cluster", []step{
			{from: 3, payload: probeMsg(1, 0, 1), wantErr: "from process 3"},
		}},
		{"errors stick", []step{
			{payload: []byte{}, wantErr: "truncated"},
			{payload: probeMsg(1, 0, 1), wantErr: "truncated"},
			{report: rep(1, 0, true), wantErr: "truncated"},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr, o := newTest(t, 1, 3)
			for i, s := range c.steps {
				wakes := o.wakes
				var err error
				var ok bool
				if s.report != nil {
					_, ok, err = tr.Report(*s.report)
				} else {
					err = tr.Deliver(s.from, s.payload)
				}
				if s.wantErr != "" {
					require.Error(t, err, "step %d", i)
					assert.Contains(t, err.Error(), s.wantErr, "step %d", i)
					continue
				}
				require.NoError(t, err, "step %d", i)
				assert.Equal(t, s.wantOK, ok, "step %d", i)
				assert.Len(t, o.take(), s.wantOut, "step %d", i)
				assert.Equal(t, s.wake, o.wakes > wakes, "step %d: wake", i)
			}
		})
	}
}

func TestLeaderMessageHandling(t *testing.T) {
	cases := []struct {
		name    string
		from    int
		payload []byte
		wantErr string
	}{
		{"reply of the wave in progress", 1, replyMsg(5, 0, 1, 0, 0), ""},
		{"stale reply of a decided key", 2, replyMsg(4, 0, 7, 0, 0), ""},
		{"reply of another wave", 1, replyMsg(5, 0, 2, 0, 0), "wave in progress is (epoch 5, phase 0) wave 1"},
		{"reply of a future key", 1, replyMsg(5, 1, 1, 0, 0), "wave in progress"},
		{"probe at the leader", 1, probeMsg(5, 0, 1), "only takes replies"},
		{"decision at the leader", 1, decisionMsg(5, 0), "only takes replies"},
		{"malformed", 1, []byte{wireVersion}, "truncated"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr := New(0, 3, func(int, []byte) error { return nil }, nil)
			// Decide (4, 0) quickly, then open (5, 0).
			tr.singleWave = true
			_, _, err := tr.Report(Report{Epoch: 4, Ready: true})
			require.NoError(t, err)
			require.NoError(t, tr.Deliver(1, replyMsg(4, 0, 1, 0, 0)))
			require.NoError(t, tr.Deliver(2, replyMsg(4, 0, 1, 0, 0)))
			tr.singleWave = false
			_, ok, err := tr.Report(Report{Epoch: 4, Ready: true})
			require.NoError(t, err)
			require.True(t, ok)
			_, _, err = tr.Report(Report{Epoch: 5, Ready: false})
			require.NoError(t, err)

			err = tr.Deliver(c.from, c.payload)
			if c.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.wantErr)
		})
	}
}

func TestLeaderRejectsADuplicateReply(t *testing.T) {
	tr, _ := newTest(t, 0, 3)
	_, _, err := tr.Report(Report{Epoch: 0})
	require.NoError(t, err)
	require.NoError(t, tr.Deliver(1, replyMsg(0, 0, 1, 0, 0)))
	err = tr.Deliver(1, replyMsg(0, 0, 1, 0, 0))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "second reply from process 1")
}

func TestReportRejectsViewsThatBreakTheContract(t *testing.T) {
	cases := []struct {
		name    string
		first   Report
		second  Report
		wantErr string
	}{
		{"key goes back", Report{Epoch: 3, Phase: 1}, Report{Epoch: 3}, "keys only go forward"},
		{"key moves before its decision", Report{Epoch: 3, Ready: true, Sent: 1}, Report{Epoch: 4}, "before (epoch 3, phase 0) was decided"},
		{"Ready withdrawn", Report{Epoch: 3, Ready: true, Sent: 1}, Report{Epoch: 3, Sent: 1}, "withdraws Ready"},
		{"counters go back", Report{Epoch: 3, Sent: 5, Received: 2}, Report{Epoch: 3, Sent: 4, Received: 2}, "counters went back"},
		{"Done shrinks", Report{Epoch: 3, Done: []int{1, 2}}, Report{Epoch: 3, Done: []int{2}}, "drops steps"},
		{"negative epoch", Report{Epoch: 3}, Report{Epoch: -1}, "negative epoch"},
		{"negative phase", Report{Epoch: 3}, Report{Epoch: 3, Phase: -1}, "negative epoch or phase"},
		{"negative counter", Report{Epoch: 3}, Report{Epoch: 3, Received: -1}, "negative counters"},
		{"negative input step", Report{Epoch: 3}, Report{Epoch: 3, Done: []int{-2}}, "negative input step"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr := New(0, 1, nil, nil)
			_, _, err := tr.Report(c.first)
			require.NoError(t, err)
			_, _, err = tr.Report(c.second)
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.wantErr)
			assert.Contains(t, err.Error(), "progress: process 0 of 1")
		})
	}
}

func TestNewWithABadConfigurationFailsEveryCall(t *testing.T) {
	cases := []struct {
		name         string
		index, count int
		send         func(int, []byte) error
		wantErr      string
	}{
		{"no processes", 0, 0, nil, "a cluster of 0 processes"},
		{"index too large", 3, 3, func(int, []byte) error { return nil }, "index 3 outside a cluster of 3"},
		{"negative index", -1, 3, func(int, []byte) error { return nil }, "index -1"},
		{"no send", 1, 3, nil, "no send function"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr := New(c.index, c.count, c.send, nil)
			_, _, err := tr.Report(Report{})
			require.ErrorContains(t, err, c.wantErr)
			require.ErrorContains(t, tr.Deliver(0, probeMsg(0, 0, 1)), c.wantErr)
		})
	}
}

func TestSendErrorFailsTheTracker(t *testing.T) {
	boom := errors.New("peer gone")
	tr := New(0, 2, func(int, []byte) error { return boom }, nil)
	_, _, err := tr.Report(Report{Epoch: 0})
	require.ErrorIs(t, err, boom)
	assert.Contains(t, err.Error(), "sending a probe to process 1")
	_, _, err = tr.Report(Report{Epoch: 0})
	require.ErrorIs(t, err, boom, "the error sticks")
}
