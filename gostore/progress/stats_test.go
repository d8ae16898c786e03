package progress

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func durationMicros(n int) time.Duration { return time.Duration(n) * time.Microsecond }

func TestStatsPercentilesCoverRecentCloses(t *testing.T) {
	var s stats
	for i := 1; i <= 100; i++ {
		s.close.add(durationMicros(i))
		s.settle.add(durationMicros(i / 10))
	}
	st := s.snapshot(true)
	assert.Equal(t, 100, st.CloseSamples)
	assert.Equal(t, durationMicros(50), st.CloseP50)
	assert.Equal(t, durationMicros(99), st.CloseP99)
	assert.Equal(t, durationMicros(100), st.CloseMax)
	assert.Equal(t, durationMicros(5), st.SettleP50)
	assert.Equal(t, durationMicros(9), st.SettleP99)
	assert.Equal(t, durationMicros(10), st.SettleMax)
	for i := 0; i < latencyWindow; i++ {
		s.close.add(durationMicros(1000))
	}
	st = s.snapshot(true)
	assert.Equal(t, latencyWindow, st.CloseSamples)
	assert.Equal(t, durationMicros(1000), st.CloseP50, "older samples left the window")
}

func TestLeaderMeasuresCloseFromFirstProbeAndSettleFromAllReady(t *testing.T) {
	tr, _ := newTest(t, 0, 2)
	var now time.Time
	tr.now = func() time.Time { return now }
	at := func(us int) { now = time.Unix(0, 0).Add(durationMicros(us)) }

	at(0)
	_, _, err := tr.Report(Report{Epoch: 1}) // wave 1 probes
	require.NoError(t, err)
	at(10)
	_, _, err = tr.Report(Report{Epoch: 1, Ready: true})
	require.NoError(t, err)
	at(20)
	require.NoError(t, tr.Deliver(1, replyMsg(1, 0, 1, 0, 0))) // every process has replied
	at(25)
	require.NoError(t, tr.Deliver(1, replyMsg(1, 0, 2, 0, 0)))
	at(30)
	_, ok, err := tr.Report(Report{Epoch: 1, Ready: true})
	require.NoError(t, err)
	require.True(t, ok)

	st := tr.Stats()
	assert.Equal(t, 1, st.CloseSamples)
	assert.Equal(t, durationMicros(30), st.CloseP50)
	assert.Equal(t, durationMicros(10), st.SettleP50)
	assert.Equal(t, 2, st.LastWaves)
}
