package durable

import (
	"fmt"
	"math/rand"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/rowbatch"
)

// A carried state written whole is, batch after batch, exactly the state
// the batches make: at random shares of keys changed and deleted, keys
// repeated in a batch, whole batches from the flow, epochs with a second
// batch, and with folds and arena compactions on every batch or never.
// With batches in memory of their own (as the C packer's are), each is
// released as soon as it is written, its bytes overwritten then: the state
// never reads a batch's memory it does not hold, and lets go of every one.
func TestCarriedStateMatchesTheBatches(t *testing.T) {
	for _, c := range []struct {
		name                    string
		foldFloor, compactFloor int64
		backed                  bool
	}{
		{"defaults", foldFloor, compactFloor, false},
		{"fold and compact every batch", 0, 0, false},
		{"fold every batch", 0, 1 << 40, false},
		{"batches in memory of their own", foldFloor, compactFloor, true},
		{"batches in memory of their own, compact every batch", 0, 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			for seed := int64(1); seed <= 20; seed++ {
				rng := rand.New(rand.NewSource(seed))
				carry := newCarried(true, 1<<30)
				carry.foldFloor, carry.compactFloor = c.foldFloor, c.compactFloor
				want := map[[2]string]string{}
				keys := 50 + rng.Intn(400)
				var made int64
				var freed atomic.Int64
				batch := func(e int64) rowbatch.Batch {
					b := randomBatch(rng, e, keys, want)
					if c.backed {
						made++
						b = Packed(t, e, b.Rows, b.Whole, &freed)
					}
					return b
				}
				for e := int64(1); e <= 40; e++ {
					b := batch(e)
					asked := rng.Intn(3) > 0
					out, added := carry.take(b, asked)
					wrote := asked && !b.Whole
					got := map[[2]string]string{}
					for _, r := range out.Rows {
						if r.Deleted || !wrote {
							continue
						}
						_, dup := got[[2]string{r.StepID, r.Key}]
						require.False(t, dup, "seed %d epoch %d: key %q twice", seed, e, r.Key)
						got[[2]string{r.StepID, r.Key}] = string(r.Value)
					}
					// (the readers are done with the batch)
					out.Release()
					second := rng.Intn(8) == 0
					if second {
						extra := batch(e)
						again, no := carry.take(extra, true)
						again.Release()
						require.Equal(t, -1, no, "seed %d epoch %d: a second batch is not written whole", seed, e)
					}
					if !wrote {
						require.Equal(t, -1, added)
						continue
					}
					require.True(t, out.Whole)
					if second {
						// (the whole batch was written before the second one)
						continue
					}
					require.Equal(t, want, got, "seed %d epoch %d", seed, e)
				}
				carry.stop()
				require.Equal(t, made, freed.Load(), "seed %d: every batch's memory is let go", seed)
			}
		})
	}
}

// randomBatch changes and deletes random keys of two steps, now and then
// repeats a key (the last row wins) or is the whole state, and applies
// itself to want.
func randomBatch(rng *rand.Rand, e int64, keys int, want map[[2]string]string) rowbatch.Batch {
	b := rowbatch.Batch{Epoch: e}
	if rng.Intn(10) == 0 {
		b.Whole = true
		for k := range want {
			delete(want, k)
		}
	}
	share := rng.Float64()
	for k := 0; k < keys; k++ {
		if !b.Whole && rng.Float64() >= share {
			continue
		}
		r := rowbatch.Row{StepID: []string{"a", "bb"}[k%2], Key: fmt.Sprintf("k%03d", k), Epoch: e}
		if rng.Intn(5) == 0 {
			r.Deleted = true
		} else {
			r.Value = []byte(fmt.Sprintf("%d-%d-%s", k, e, "zzzzzzzz"[:rng.Intn(8)]))
		}
		b.Rows = append(b.Rows, r)
	}
	if len(b.Rows) > 0 && rng.Intn(3) == 0 {
		r := b.Rows[rng.Intn(len(b.Rows))]
		r.Deleted, r.Value = false, []byte(fmt.Sprintf("again-%d", e))
		b.Rows = append(b.Rows, r)
	}
	rng.Shuffle(len(b.Rows), func(i, j int) { b.Rows[i], b.Rows[j] = b.Rows[j], b.Rows[i] })
	// Rows of one key apply in batch order.
	for _, r := range b.Rows {
		if r.Deleted {
			delete(want, [2]string{r.StepID, r.Key})
		} else {
			want[[2]string{r.StepID, r.Key}] = string(r.Value)
		}
	}
	return b
}
