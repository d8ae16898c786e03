package rowbatch

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEncodeDecodeRoundTrip(t *testing.T) {
	cases := []struct {
		name string
		rows []Row
	}{
		{"empty", nil},
		{"one value", []Row{{StepID: "f.count", Key: "a", Value: []byte{1, 2, 3}}}},
		{"deletion", []Row{{StepID: "f.count", Key: "a", Deleted: true}}},
		{"empty key and empty value", []Row{{StepID: "s", Key: "", Value: []byte{}}}},
		{"mixed", []Row{
			{StepID: "f.a", Key: "k1", Value: []byte("x")},
			{StepID: "f.b", Key: "ключ", Deleted: true},
			{StepID: "f.a", Key: "k2", Value: make([]byte, 300)},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := Decode(Encode(c.rows), 7)
			require.NoError(t, err)
			require.Len(t, got, len(c.rows))
			for i, want := range c.rows {
				assert.Equal(t, want.StepID, got[i].StepID)
				assert.Equal(t, want.Key, got[i].Key)
				assert.Equal(t, int64(7), got[i].Epoch)
				assert.Equal(t, want.Deleted, got[i].Deleted)
				if !want.Deleted {
					assert.Equal(t, len(want.Value), len(got[i].Value))
					assert.Equal(t, string(want.Value), string(got[i].Value))
				}
			}
		})
	}
}

func TestDecodeRejectsMalformed(t *testing.T) {
	good := Encode([]Row{{StepID: "s", Key: "k", Value: []byte("v")}})
	cases := []struct {
		name string
		buf  []byte
		want string
	}{
		{"no header", []byte("XXXX"), "header"},
		{"short", []byte("MP"), "header"},
		{"truncated", good[:len(good)-1], "overruns"},
		{"trailing", append(append([]byte{}, good...), 0), "trailing"},
		{"lying count", []byte("MPB1\xff\xff\xff\x0f"), "row count"},
		{"empty step", Encode([]Row{{StepID: "", Key: "k", Deleted: true}}), "empty step id"},
		{"bad varint", []byte("MPB1\x01\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"), "bad step id length varint at byte 5"},
		{"bad key length", []byte("MPB1\x01\x01s\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"), "bad key length varint at byte 7"},
		{"bad value tag", []byte("MPB1\x01\x01s\x01k\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"), "bad value tag varint at byte 9"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Decode(c.buf, 1)
			require.ErrorIs(t, err, ErrMalformed)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

func TestLessOrdersByStepKeyEpoch(t *testing.T) {
	a := Row{StepID: "a", Key: "z", Epoch: 9}
	b := Row{StepID: "b", Key: "a", Epoch: 1}
	c := Row{StepID: "b", Key: "a", Epoch: 2}
	assert.True(t, Less(&a, &b))
	assert.True(t, Less(&b, &c))
	assert.False(t, Less(&c, &b))
}

// FuzzDecodeBatch feeds arbitrary bytes to the decoder: it may reject them,
// but must never panic, and whatever it accepts must survive a round trip
// (varints may be non-minimal, so the bytes themselves can differ).
func FuzzDecodeBatch(f *testing.F) {
	f.Add(Encode(nil))
	f.Add(Encode([]Row{{StepID: "s", Key: "k", Value: []byte("v")}, {StepID: "t", Key: "", Deleted: true}}))
	f.Add([]byte("MPB1\x02\x01s\x01k\x00"))
	f.Fuzz(func(t *testing.T, buf []byte) {
		rows, err := Decode(buf, 3)
		if err != nil {
			return
		}
		again, err := Decode(Encode(rows), 3)
		require.NoError(t, err)
		require.Equal(t, len(rows), len(again))
		for i := range rows {
			require.Equal(t, rows[i].StepID, again[i].StepID)
			require.Equal(t, rows[i].Key, again[i].Key)
			require.Equal(t, rows[i].Deleted, again[i].Deleted)
			require.Equal(t, string(rows[i].Value), string(again[i].Value))
		}
	})
}
