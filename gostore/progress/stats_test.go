package progress

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func durationMicros(n int) time.Duration { return time.Duration(n) * time.Microsecond }

func TestStatsPercentilesCoverRecentCloses(t *testing.T) {
	var s stats
	for i := 1; i <= 100; i++ {
		s.closed(durationMicros(i))
	}
	st := s.snapshot(true)
	assert.Equal(t, 100, st.CloseSamples)
	assert.Equal(t, durationMicros(50), st.CloseP50)
	assert.Equal(t, durationMicros(99), st.CloseP99)
	assert.Equal(t, durationMicros(100), st.CloseMax)
	for i := 0; i < latencyWindow; i++ {
		s.closed(durationMicros(1000))
	}
	st = s.snapshot(true)
	assert.Equal(t, latencyWindow, st.CloseSamples)
	assert.Equal(t, durationMicros(1000), st.CloseP50, "older samples left the window")
}
