package progress

import "time"

// reply is one process's answer to one wave.
type reply struct {
	ok             bool
	sent, received int64
	done           []int
}

// leader is process 0's wave state for the key it is deciding.
type leader struct {
	active  bool      // a key is being decided
	key     key       // that key
	wave    int       // the current wave, from 1
	started time.Time // when wave 1 of key was sent
	cur     []reply   // replies of the current wave, by process
	prev    []reply   // replies of the previous wave, when hasPrev
	hasPrev bool
	got     int // replies of the current wave in

	// For the settle latency: which processes replied to some wave of key
	// yet, and when the last of them first did.
	replied  []bool
	nReplied int
	allReady time.Time
}

func newLeader(count int) *leader {
	return &leader{cur: make([]reply, count), prev: make([]reply, count), replied: make([]bool, count)}
}

// record takes process i's reply to the current wave.
func (t *Tracker) record(i int, r reply) {
	l := t.lead
	l.cur[i] = r
	l.got++
	if !l.replied[i] {
		l.replied[i] = true
		l.nReplied++
		if l.nReplied == t.count {
			l.allReady = t.now()
		}
	}
}

// leaderReport runs the leader's side of a Report (under mu): a fresh key
// starts wave 1, and a Ready report is the leader's own reply. When that
// reply completes a wave and a new one starts, the leader answers the new
// wave at the same quiescent point; it answers at most two waves per
// report.
func (t *Tracker) leaderReport(fresh bool) []outgoing {
	l := t.lead
	var out []outgoing
	if fresh {
		l.active, l.key, l.wave, l.hasPrev = true, t.cur, 0, false
		clear(l.replied)
		l.nReplied = 0
		l.started = t.now()
		out = t.startWave()
	}
	for range 2 {
		if !t.ready || !l.active || l.cur[0].ok {
			break
		}
		t.record(0, reply{ok: true, sent: t.sent, received: t.received, done: t.done})
		if l.got == t.count {
			out = append(out, t.completeWave()...)
		}
	}
	return out
}

// leaderDeliver takes another process's reply (under mu).
func (t *Tracker) leaderDeliver(from int, m message) ([]outgoing, bool, error) {
	if t.stale(m.key) {
		return nil, false, nil
	}
	l := t.lead
	if !l.active || m.key != l.key || m.wave != l.wave {
		return nil, false, t.errorf("reply from process %d for %v wave %d, but the wave in progress is %v wave %d (active %v)",
			from, m.key, m.wave, l.key, l.wave, l.active)
	}
	if l.cur[from].ok {
		return nil, false, t.errorf("second reply from process %d for %v wave %d", from, m.key, m.wave)
	}
	t.record(from, reply{ok: true, sent: m.sent, received: m.received, done: m.done})
	if l.got < t.count {
		return nil, false, nil
	}
	return t.completeWave(), true, nil
}

// startWave sends the probes of the next wave.
func (t *Tracker) startWave() []outgoing {
	l := t.lead
	l.wave++
	clear(l.cur)
	l.got = 0
	t.st.waves++
	out := make([]outgoing, 0, t.count-1)
	for to := 1; to < t.count; to++ {
		p := encode(message{kind: kindProbe, key: l.key, wave: l.wave})
		out = append(out, outgoing{to: to, kind: kindProbe, payload: p})
	}
	return out
}

// completeWave decides the key, or starts the next wave, once every reply
// of the current wave is in.
func (t *Tracker) completeWave() []outgoing {
	l := t.lead
	stable := l.hasPrev
	var sent, received int64
	for i, r := range l.cur {
		sent += r.sent
		received += r.received
		if l.hasPrev && (l.prev[i].sent != r.sent || l.prev[i].received != r.received) {
			stable = false
		}
	}
	if sent == received && (stable || t.singleWave) {
		return t.decide()
	}
	l.prev, l.cur = l.cur, l.prev
	l.hasPrev = true
	return t.startWave()
}

// decide records the decision of the leader's key and sends it to all.
func (t *Tracker) decide() []outgoing {
	l := t.lead
	done := l.cur[0].done
	for _, r := range l.cur[1:] {
		done = intersect(done, r.done)
	}
	d := Decision{Epoch: l.key.epoch, Phase: l.key.phase, Done: append([]int{}, done...)}
	t.decided, t.lastKey, t.last = true, l.key, d
	l.active = false
	t.st.decisions++
	t.st.lastWaves = l.wave
	if l.key.phase == 0 {
		now := t.now()
		t.st.close.add(now.Sub(l.started))
		t.st.settle.add(now.Sub(l.allReady))
	}
	if t.onDecide != nil {
		t.onDecide(t.decision())
	}
	out := make([]outgoing, 0, t.count-1)
	for to := 1; to < t.count; to++ {
		p := encode(message{kind: kindDecision, key: l.key, done: d.Done})
		out = append(out, outgoing{to: to, kind: kindDecision, payload: p})
	}
	return out
}

// intersect returns the elements of sorted a also in sorted b, in a new
// slice.
func intersect(a, b []int) []int {
	out := []int{}
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		switch {
		case a[i] < b[j]:
			i++
		case a[i] > b[j]:
			j++
		default:
			out = append(out, a[i])
			i++
			j++
		}
	}
	return out
}
