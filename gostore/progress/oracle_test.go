package progress

import (
	"fmt"
	"math/bits"
	"slices"
	"sync"
)

// oracle is the global view no process has.
type oracle struct {
	abort func()

	mu       sync.Mutex
	inflight map[key]int // data messages of a key sent and not yet processed
	at       []key
	ready    []bool
	done     []uint64
	failures []string
}

func newOracle(n int, abort func()) *oracle {
	return &oracle{abort: abort, inflight: map[key]int{}, at: make([]key, n), ready: make([]bool, n), done: make([]uint64, n)}
}

func (o *oracle) fail(format string, args ...any) {
	o.mu.Lock()
	if len(o.failures) < 10 {
		o.failures = append(o.failures, fmt.Sprintf(format, args...))
	}
	o.mu.Unlock()
	o.abort()
}

func (o *oracle) result() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.failures)
}

func (o *oracle) sent(tag key) {
	o.mu.Lock()
	o.inflight[tag]++
	o.mu.Unlock()
}

func (o *oracle) processed(tag key) {
	o.mu.Lock()
	o.inflight[tag]--
	o.mu.Unlock()
}

func (o *oracle) enter(i int, k key) {
	o.mu.Lock()
	o.at[i], o.ready[i] = k, false
	o.mu.Unlock()
}

func (o *oracle) setReady(i int) {
	o.mu.Lock()
	o.ready[i] = true
	o.mu.Unlock()
}

func (o *oracle) setDone(i int, done uint64) {
	o.mu.Lock()
	o.done[i] = done
	o.mu.Unlock()
}

// behind reports whether process i is at a key before k.
func (o *oracle) behind(i int, k key) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.at[i].less(k)
}

func (o *oracle) unprocessed() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, c := range o.inflight {
		n += c
	}
	return n
}

// decided runs at the instant the leader decides (under its tracker's
// lock, before anyone can act on the decision).
func (o *oracle) decided(d Decision) {
	k := key{d.Epoch, d.Phase}
	var bad []string
	o.mu.Lock()
	for tag, c := range o.inflight {
		if c != 0 && !k.less(tag) {
			bad = append(bad, fmt.Sprintf("decision of %v while %d data message(s) of %v are sent but not processed", k, c, tag))
		}
	}
	all := ^uint64(0)
	for i := range o.at {
		if o.at[i] != k || !o.ready[i] {
			bad = append(bad, fmt.Sprintf("decision of %v while process %d is at %v, ready %v", k, i, o.at[i], o.ready[i]))
		}
		all &= o.done[i]
	}
	var want []int
	for ; all != 0; all &= all - 1 {
		want = append(want, bits.TrailingZeros64(all))
	}
	if fmt.Sprint(want) != fmt.Sprint(d.Done) {
		bad = append(bad, fmt.Sprintf("decision of %v with Done %v, the processes' intersection is %v", k, d.Done, want))
	}
	o.mu.Unlock()
	for _, b := range bad {
		o.fail("%s", b)
	}
}

func (o *oracle) dump() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return fmt.Sprintf("at %v ready %v inflight %v", o.at, o.ready, o.inflight)
}
