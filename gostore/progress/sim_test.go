package progress

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The simulation: n goroutine "processes", each with its own driver loop
// that alternates activations with Report, exchanging data messages over
// in-memory links with random delays (unordered) and control messages over
// FIFO links with random delays. A global oracle counts, per (epoch, phase)
// tag, the data messages sent and not yet processed, and checks at the
// instant the leader decides that nothing of that key or an earlier one is
// unprocessed and every process is at the key and ready; receivers check
// that no message is processed after they moved past its key.

// simConfig shapes one simulated run.
type simConfig struct {
	n         int
	epochs    int
	maxPhases int // phases per epoch: 1..maxPhases, the same on every process
	maxActive int // activations of phase 0 before a process is ready: 0..maxActive
	sendPct   int // percent of active activations that send 1..2 messages
	eofSends  int // messages an end-of-input activation sends: 0..eofSends
	maxTTL    int // a fresh message's ttl: 0..maxTTL
	maxFanout int // a processed message with ttl > 0 sends 0..maxFanout more
	inputs    int // input steps whose end the processes report in Done
	dataDelay time.Duration
	longDelay time.Duration // a data message is late by up to this much, longPct percent of the time
	longPct   int
	ctlDelay  time.Duration
	timeout   time.Duration
	// singleWave runs the deliberately broken protocol that decides
	// after one wave.
	singleWave bool
}

func defaultSimConfig(n int) simConfig {
	return simConfig{
		n: n, epochs: 4, maxPhases: 3, maxActive: 25, sendPct: 40, eofSends: 2,
		maxTTL: 3, maxFanout: 3, inputs: 3,
		dataDelay: 150 * time.Microsecond, longDelay: 4 * time.Millisecond, longPct: 5,
		ctlDelay: 100 * time.Microsecond, timeout: 15 * time.Second,
	}
}

// simResult is what a run found.
type simResult struct {
	failures  []string     // oracle violations and protocol errors
	decisions [][]Decision // per process, in order
	leader    Stats
	keys      int // keys every process went through
	seen      simSeen
}

// simSeen counts the situations a run went through, to show the harness
// reaches them.
type simSeen struct {
	messages     int64 // data messages sent
	cascades     int64 // of them, sent while processing a received message
	late         int64 // data messages delayed by the long delay
	earlyData    int64 // data messages that reached a process still at an earlier key
	futureProbes int64 // probes that reached a process still at an earlier key
	waves        int64 // waves the leader ran
}

func (a *simSeen) add(b simSeen) {
	a.messages += b.messages
	a.cascades += b.cascades
	a.late += b.late
	a.earlyData += b.earlyData
	a.futureProbes += b.futureProbes
	a.waves += b.waves
}

func (a simSeen) String() string {
	return fmt.Sprintf("%d data messages (%d cascaded, %d late, %d arrived before their key), %d probes before their key, %d waves",
		a.messages, a.cascades, a.late, a.earlyData, a.futureProbes, a.waves)
}

func (r simResult) String() string {
	if len(r.failures) == 0 {
		return "ok"
	}
	return strings.Join(r.failures, "\n")
}

type dataMsg struct {
	tag  key
	ttl  int
	from int
}

// link is the FIFO control channel from one tracker to another.
type link struct {
	mu   sync.Mutex
	rng  *rand.Rand
	last time.Time
	ch   chan ctlMsg
}

type ctlMsg struct {
	at      time.Time
	payload []byte
}

type sim struct {
	cfg   simConfig
	seed  uint64
	o     *oracle
	procs []*simProc
	links [][]*link

	stopOnce sync.Once
	stop     chan struct{}
	timers   sync.WaitGroup // data messages still to land in an inbox

	messages, cascades, late, earlyData, futureProbes atomic.Int64
}

type simProc struct {
	i      int
	s      *sim
	tr     *Tracker
	rng    *rand.Rand
	notify chan struct{}

	mu    sync.Mutex
	inbox []dataMsg

	// Driver-only state.
	sent, received int64
	done           uint64
	decisions      []Decision
}

// runSim runs one simulation to its end (every process through every key)
// or to the first failure.
func runSim(cfg simConfig, seed uint64) simResult {
	s := &sim{cfg: cfg, seed: seed, stop: make(chan struct{})}
	s.o = newOracle(cfg.n, s.abort)
	s.links = make([][]*link, cfg.n)
	for i := range s.links {
		s.links[i] = make([]*link, cfg.n)
		for j := range s.links[i] {
			if i != j {
				s.links[i][j] = &link{rng: rand.New(rand.NewPCG(seed, uint64(1000+i*cfg.n+j))), ch: make(chan ctlMsg, 1024)}
			}
		}
	}
	for i := range cfg.n {
		p := &simProc{i: i, s: s, rng: rand.New(rand.NewPCG(seed, uint64(i))), notify: make(chan struct{}, 1)}
		p.tr = New(i, cfg.n, s.sender(i), p.signal)
		if i == 0 {
			p.tr.onDecide = s.o.decided
			p.tr.singleWave = cfg.singleWave
		}
		s.procs = append(s.procs, p)
	}
	var links sync.WaitGroup
	for i := range cfg.n {
		for j := range cfg.n {
			if i != j {
				links.Add(1)
				go func() { defer links.Done(); s.carry(i, j) }()
			}
		}
	}
	watchdog := time.AfterFunc(cfg.timeout, func() {
		s.o.fail("no end after %v: %s", cfg.timeout, s.o.dump())
	})
	var drivers sync.WaitGroup
	for _, p := range s.procs {
		drivers.Add(1)
		go func() { defer drivers.Done(); p.run() }()
	}
	drivers.Wait()
	watchdog.Stop()
	s.abort() // ends the links
	links.Wait()
	s.timers.Wait()

	res := simResult{leader: s.procs[0].tr.Stats()}
	for _, p := range s.procs {
		res.decisions = append(res.decisions, p.decisions)
	}
	for e := range cfg.epochs {
		res.keys += s.phases(e)
	}
	res.seen = simSeen{
		messages: s.messages.Load(), cascades: s.cascades.Load(), late: s.late.Load(),
		earlyData: s.earlyData.Load(), futureProbes: s.futureProbes.Load(), waves: res.leader.Waves,
	}
	res.failures = s.o.result()
	if len(res.failures) == 0 {
		res.failures = s.finalChecks(res)
	}
	return res
}

func (s *sim) abort() { s.stopOnce.Do(func() { close(s.stop) }) }

func (s *sim) stopped() bool {
	select {
	case <-s.stop:
		return true
	default:
		return false
	}
}

// phases is how many decisions epoch e takes: every process computes the
// same number, as every driver computes the same phases from decisions.
func (s *sim) phases(e int) int {
	h := s.seed*0x9e3779b97f4a7c15 + uint64(e+1)*0xbf58476d1ce4e5b9
	h ^= h >> 31
	return 1 + int(h%uint64(s.cfg.maxPhases))
}

// sender is process i's tracker's send: FIFO per pair, randomly delayed.
func (s *sim) sender(i int) func(int, []byte) error {
	return func(to int, payload []byte) error {
		l := s.links[i][to]
		l.mu.Lock()
		at := time.Now().Add(randDelay(l.rng, s.cfg.ctlDelay))
		if at.Before(l.last) {
			at = l.last
		}
		l.last = at
		l.mu.Unlock()
		select {
		case l.ch <- ctlMsg{at: at, payload: slices.Clone(payload)}:
			return nil
		default:
			return fmt.Errorf("control link %d->%d full", i, to)
		}
	}
}

// randDelay is zero a quarter of the time, else uniform up to max.
func randDelay(rng *rand.Rand, max time.Duration) time.Duration {
	if max <= 0 || rng.IntN(4) == 0 {
		return 0
	}
	return time.Duration(rng.Int64N(int64(max)))
}

// carry delivers the control messages from i to j in order.
func (s *sim) carry(i, j int) {
	l := s.links[i][j]
	for {
		select {
		case <-s.stop:
			return
		case m := <-l.ch:
			if d := time.Until(m.at); d > 0 {
				select {
				case <-s.stop:
					return
				case <-time.After(d):
				}
			}
			if msg, err := decode(m.payload); err == nil && msg.kind == kindProbe && s.o.behind(j, msg.key) {
				s.futureProbes.Add(1)
			}
			if err := s.procs[j].tr.Deliver(i, m.payload); err != nil {
				s.o.fail("process %d delivering from %d: %v", j, i, err)
				return
			}
		}
	}
}

func (p *simProc) signal() {
	select {
	case p.notify <- struct{}{}:
	default:
	}
}

// sendData sends a data message tagged with the sender's key to another
// process, after a random delay (data links do not keep order).
func (p *simProc) sendData(tag key, ttl int) {
	cfg := p.s.cfg
	if cfg.n < 2 {
		return
	}
	to := p.rng.IntN(cfg.n - 1)
	if to >= p.i {
		to++
	}
	p.sent++
	p.s.o.sent(tag)
	p.s.messages.Add(1)
	delay := randDelay(p.rng, cfg.dataDelay)
	if p.rng.IntN(100) < cfg.longPct {
		delay = time.Duration(p.rng.Int64N(int64(cfg.longDelay) + 1))
		p.s.late.Add(1)
	}
	q := p.s.procs[to]
	m := dataMsg{tag: tag, ttl: ttl, from: p.i}
	p.s.timers.Add(1)
	time.AfterFunc(delay, func() {
		defer p.s.timers.Done()
		if p.s.o.behind(to, m.tag) {
			p.s.earlyData.Add(1)
		}
		q.mu.Lock()
		q.inbox = append(q.inbox, m)
		q.mu.Unlock()
		q.signal()
	})
}

// drain takes the inbox's messages of keys up to cur (later ones wait for
// this process to get there) and processes them: a message with ttl > 0
// sends 0..maxFanout more. It reports whether it took any.
func (p *simProc) drain(cur key) bool {
	p.mu.Lock()
	var take []dataMsg
	keep := p.inbox[:0]
	for _, m := range p.inbox {
		if cur.less(m.tag) {
			keep = append(keep, m)
		} else {
			take = append(take, m)
		}
	}
	p.inbox = keep
	p.mu.Unlock()
	for _, m := range take {
		p.received++ // taken: counted before the activation processes it
		if m.tag.less(cur) {
			p.s.o.fail("process %d processed a message of %v from %d after moving on to %v", p.i, m.tag, m.from, cur)
		}
		if m.ttl > 0 {
			for range p.rng.IntN(p.s.cfg.maxFanout + 1) {
				p.s.cascades.Add(1)
				p.sendData(cur, m.ttl-1)
			}
		}
		p.s.o.processed(m.tag)
	}
	return len(take) > 0
}

func (p *simProc) doneList() []int {
	var out []int
	for d := p.done; d != 0; d &= d - 1 {
		out = append(out, bits.TrailingZeros64(d))
	}
	return out
}

// run is the driver loop: every epoch, phase 0 is active for a random
// number of activations (polling: sending, ending inputs), then ready and
// passive; each later phase starts with an end-of-input activation that
// may send, and is ready at once.
func (p *simProc) run() {
	cfg := p.s.cfg
	o := p.s.o
	for e := range cfg.epochs {
		for ph := range p.s.phases(e) {
			k := key{int64(e), ph}
			o.enter(p.i, k)
			active := 0
			if ph == 0 {
				active = p.rng.IntN(cfg.maxActive + 1)
			} else {
				for range p.rng.IntN(cfg.eofSends + 1) {
					p.sendData(k, p.rng.IntN(cfg.maxTTL+1))
				}
			}
			ready := active == 0
			for {
				if p.s.stopped() {
					return
				}
				if !ready { // an activation that polls the sources
					if p.rng.IntN(100) < cfg.sendPct {
						for range 1 + p.rng.IntN(2) {
							p.sendData(k, p.rng.IntN(cfg.maxTTL+1))
						}
					}
					if cfg.inputs > 0 && p.rng.IntN(100) < 4 {
						p.done |= 1 << p.rng.IntN(cfg.inputs)
						o.setDone(p.i, p.done)
					}
					active--
					ready = active == 0
				}
				if ready {
					o.setReady(p.i)
				}
				took := p.drain(k)
				d, ok, err := p.tr.Report(Report{Epoch: k.epoch, Phase: k.phase, Ready: ready,
					Done: p.doneList(), Sent: p.sent, Received: p.received})
				if err != nil {
					o.fail("process %d reporting %v: %v", p.i, k, err)
					return
				}
				if ok {
					if (key{d.Epoch, d.Phase}) != k {
						o.fail("process %d reported %v and got the decision of (%d, %d)", p.i, k, d.Epoch, d.Phase)
					}
					p.decisions = append(p.decisions, d)
					break
				}
				switch {
				case ready && !took:
					// Passive with nothing taken: wait for a message, a
					// probe or a decision.
					select {
					case <-p.notify:
					case <-p.s.stop:
						return
					}
				case p.rng.IntN(8) == 0:
					time.Sleep(time.Duration(p.rng.IntN(50)) * time.Microsecond)
				default:
					runtime.Gosched()
				}
			}
		}
	}
}

// finalChecks runs after a clean run: every process took the same
// decisions, one per key in order, with the same Done; every message was
// processed.
func (s *sim) finalChecks(res simResult) []string {
	var out []string
	want := res.decisions[0]
	if len(want) != res.keys {
		out = append(out, fmt.Sprintf("process 0 took %d decisions for %d keys", len(want), res.keys))
	}
	for i, d := range res.decisions[1:] {
		if fmt.Sprint(d) != fmt.Sprint(want) {
			out = append(out, fmt.Sprintf("process %d decided %v, process 0 %v", i+1, d, want))
		}
	}
	if res.leader.Decisions != int64(res.keys) {
		out = append(out, fmt.Sprintf("leader stats count %d decisions for %d keys", res.leader.Decisions, res.keys))
	}
	if n := s.o.unprocessed(); n != 0 {
		out = append(out, fmt.Sprintf("%d data messages never processed", n))
	}
	return out
}
