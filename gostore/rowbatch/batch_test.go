package rowbatch

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNewBatchStampsEveryRowWithItsEpoch(t *testing.T) {
	b := NewBatch(4, []Row{{StepID: "s", Key: "a"}, {StepID: "s", Key: "b", Epoch: 9}}, true)
	assert.Equal(t, int64(4), b.Epoch)
	assert.True(t, b.Whole)
	for _, r := range b.Rows {
		assert.Equal(t, int64(4), r.Epoch)
	}
}

func TestMemoryIsFreedByItsLastHolder(t *testing.T) {
	cases := []struct {
		name  string
		holds int
	}{
		{"one holder", 0},
		{"two holders", 1},
		{"three holders", 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			freed := 0
			b := Batch{Epoch: 1, Mem: NewMemory(func() { freed++ })}
			for i := 0; i < c.holds; i++ {
				b.Hold()
			}
			for i := 0; i < c.holds; i++ {
				b.Release()
				require.Zero(t, freed, "freed while a holder remains")
			}
			b.Release()
			assert.Equal(t, 1, freed)
		})
	}
}

func TestReleasingMoreThanHeldPanics(t *testing.T) {
	b := Batch{Mem: NewMemory(func() {})}
	b.Release()
	assert.Panics(t, b.Release)
}

func TestGoMemoryBatchesNeedNoRelease(t *testing.T) {
	b := NewBatch(1, []Row{{StepID: "s", Key: "a"}}, false)
	assert.NotPanics(t, func() { b.Hold().Release(); b.Release() })
}
