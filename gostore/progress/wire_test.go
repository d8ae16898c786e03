package progress

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEncodeDecodeRoundTripsEveryKind(t *testing.T) {
	cases := []message{
		{kind: kindProbe, key: key{0, 0}, wave: 1},
		{kind: kindProbe, key: key{math.MaxInt64, math.MaxInt32}, wave: math.MaxInt},
		{kind: kindReply, key: key{7, 2}, wave: 3, sent: 10, received: 9, done: []int{}},
		{kind: kindReply, key: key{7, 2}, wave: 3, sent: math.MaxInt64, received: 0, done: []int{0, 4, math.MaxInt32}},
		{kind: kindDecision, key: key{12, 0}, done: []int{}},
		{kind: kindDecision, key: key{12, 1}, done: []int{1, 2, 3}},
	}
	for _, m := range cases {
		got, err := decode(encode(m))
		require.NoError(t, err, "%+v", m)
		assert.Equal(t, m, got)
	}
}

func TestDecodeRejectsMalformedPayloads(t *testing.T) {
	probe := encode(message{kind: kindProbe, key: key{3, 1}, wave: 2})
	reply := encode(message{kind: kindReply, key: key{3, 1}, wave: 2, sent: 5, received: 4, done: []int{1, 2}})
	cases := []struct {
		name    string
		payload []byte
		want    string
	}{
		{"empty", nil, "truncated"},
		{"version only", []byte{wireVersion}, "truncated"},
		{"other version", append([]byte{2}, probe[1:]...), "version 2"},
		{"unknown kind", []byte{wireVersion, 9, 0, 0}, "unknown kind 9"},
		{"probe without wave", probe[:len(probe)-1], "wave: truncated"},
		{"probe with trailing byte", append(append([]byte{}, probe...), 0), "1 trailing bytes"},
		{"wave zero", []byte{wireVersion, kindProbe, 3, 1, 0}, "wave 0"},
		{"reply cut in done", reply[:len(reply)-1], "truncated"},
		{"varint overflow", []byte{wireVersion, kindProbe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}, "overflows"},
		{"epoch above int64", []byte{wireVersion, kindProbe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0, 1}, "epoch"},
		{"done not increasing", []byte{wireVersion, kindDecision, 1, 0, 2, 5, 5}, "strictly increasing"},
		{"done count beyond payload", []byte{wireVersion, kindDecision, 1, 0, 100, 1}, "done count 100"},
		{"done count beyond limit", []byte{wireVersion, kindDecision, 1, 0, 0xff, 0xff, 0x7f}, "out of range"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := decode(c.payload)
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

// FuzzDecode: decode never panics, and whatever it accepts encodes to a
// payload that decodes to the same message.
func FuzzDecode(f *testing.F) {
	f.Add(encode(message{kind: kindProbe, key: key{1, 0}, wave: 1}))
	f.Add(encode(message{kind: kindReply, key: key{1, 2}, wave: 4, sent: 3, received: 3, done: []int{0, 7}}))
	f.Add(encode(message{kind: kindDecision, key: key{9, 1}, done: []int{2}}))
	f.Add([]byte{wireVersion, kindDecision, 1, 0, 100, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decode(b)
		if err != nil {
			return
		}
		again, err := decode(encode(m))
		require.NoError(t, err)
		require.Equal(t, m, again)
	})
}
