package progress

import (
	"encoding/binary"
	"hash/fnv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSimulationNeverDecidesWithAMessageInFlight(t *testing.T) {
	seeds := 400
	if testing.Short() {
		seeds = 100
	}
	start := time.Now()
	var (
		mu        sync.Mutex
		seen      simSeen
		decisions int64
		next      atomic.Int64
		wg        sync.WaitGroup
	)
	// Four simulations at a time: they mostly sleep, and sharing the CPU
	// varies the timing further.
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				seed := int(next.Add(1) - 1)
				if seed >= seeds || t.Failed() {
					return
				}
				cfg := defaultSimConfig(2 + seed%4)
				res := runSim(cfg, uint64(seed))
				if len(res.failures) > 0 {
					t.Errorf("seed %d, n=%d:\n%s", seed, cfg.n, res)
					return
				}
				mu.Lock()
				seen.add(res.seen)
				decisions += res.leader.Decisions
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	t.Logf("%d seeds in %v: %d decisions; %v; %.1f waves per decision",
		seeds, time.Since(start).Round(time.Millisecond), decisions, seen, float64(seen.waves)/float64(decisions))
	assert.Positive(t, seen.cascades)
	assert.Positive(t, seen.late)
	assert.Positive(t, seen.earlyData, "some data message must arrive before its receiver reached its key")
	assert.Positive(t, seen.futureProbes, "some probe must arrive before its receiver reached its key")
}

func TestQuietEpochsDecideInTwoWaves(t *testing.T) {
	for n := 1; n <= 5; n++ {
		cfg := defaultSimConfig(n)
		cfg.sendPct, cfg.eofSends = 0, 0
		res := runSim(cfg, uint64(n))
		require.Empty(t, res.failures, "n=%d:\n%s", n, res)
		assert.Equal(t, 2*res.leader.Decisions, res.leader.Waves, "n=%d", n)
	}
}

// TestOracleCatchesDecidingAfterOneWave shows the simulation can fail: the
// deliberately broken protocol that decides as soon as one wave's totals
// match must be caught on some seed.
func TestOracleCatchesDecidingAfterOneWave(t *testing.T) {
	seeds := 300
	for seed := range seeds {
		cfg := defaultSimConfig(3 + seed%3)
		cfg.singleWave = true
		cfg.maxFanout, cfg.maxTTL = 3, 4
		res := runSim(cfg, uint64(seed))
		if len(res.failures) > 0 {
			t.Logf("caught on seed %d (n=%d): %s", seed, cfg.n, res.failures[0])
			return
		}
	}
	t.Fatalf("the oracle never caught the single-wave protocol in %d seeds", seeds)
}

// FuzzProtocol drives the simulation from fuzz bytes: the first bytes shape
// the run, the rest seed its random choices.
func FuzzProtocol(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 3, 5, 40, 1})
	f.Add([]byte{3, 3, 2, 3, 4, 20, 200, 7, 7, 7})
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{2, 2, 1, 1, 2, 90, 9, 42})
	f.Fuzz(func(t *testing.T, b []byte) {
		cfg, seed := fuzzConfig(b)
		res := runSim(cfg, seed)
		require.Empty(t, res.failures, "n=%d %+v seed %d:\n%s", cfg.n, cfg, seed, res)
	})
}

func fuzzConfig(b []byte) (simConfig, uint64) {
	at := func(i int) int {
		if i < len(b) {
			return int(b[i])
		}
		return 0
	}
	cfg := defaultSimConfig(2 + at(0)%4)
	cfg.epochs = 1 + at(1)%3
	cfg.maxPhases = 1 + at(2)%3
	cfg.maxFanout = at(3) % 4
	cfg.maxTTL = at(4) % 5
	cfg.longPct = at(5) % 30
	cfg.ctlDelay = time.Duration(at(6)) * 2 * time.Microsecond
	cfg.maxActive = 1 + at(7)%30
	h := fnv.New64a()
	h.Write(b)
	var sum [8]byte
	return cfg, binary.LittleEndian.Uint64(h.Sum(sum[:0]))
}
