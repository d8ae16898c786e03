package testlog

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestBufferTakesConcurrentLogLinesWhole(t *testing.T) {
	var b Buffer
	log := b.Logger()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				log.Debug("tick", "from", i)
			}
		}()
	}
	wg.Wait()
	assert.Len(t, b.Lines("msg=tick"), 400)
	assert.Len(t, b.Lines("msg=tick", "from=3"), 50)
	assert.Empty(t, b.Lines("msg=tock"))
}
