package progress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// wireVersion is the first byte of every control message.
const wireVersion byte = 1

// Kinds of control message.
const (
	kindProbe    byte = 1 // leader -> process: answer wave (key, wave) when ready
	kindReply    byte = 2 // process -> leader: counters and Done for (key, wave)
	kindDecision byte = 3 // leader -> process: key is decided, with Done
)

// maxDoneWire bounds the Done list of one message: input step indexes are
// small, and a bound keeps a hostile length from allocating much.
const maxDoneWire = 1 << 16

// message is one decoded control message. Fields a kind does not carry are
// zero: a probe has no counters or Done, a decision no wave or counters.
type message struct {
	kind     byte
	key      key
	wave     int
	sent     int64
	received int64
	done     []int
}

func kindName(k byte) string {
	switch k {
	case kindProbe:
		return "probe"
	case kindReply:
		return "reply"
	case kindDecision:
		return "decision"
	}
	return fmt.Sprintf("kind %d", k)
}

// encode returns m's wire form:
//
//	version byte, kind byte, uvarint epoch, uvarint phase, then
//	probe:    uvarint wave
//	reply:    uvarint wave, uvarint sent, uvarint received, done list
//	decision: done list
//
// where a done list is a uvarint count followed by that many strictly
// increasing uvarint values.
func encode(m message) []byte {
	b := make([]byte, 0, 16+len(m.done)*2)
	b = append(b, wireVersion, m.kind)
	b = binary.AppendUvarint(b, uint64(m.key.epoch))
	b = binary.AppendUvarint(b, uint64(m.key.phase))
	switch m.kind {
	case kindProbe:
		b = binary.AppendUvarint(b, uint64(m.wave))
	case kindReply:
		b = binary.AppendUvarint(b, uint64(m.wave))
		b = binary.AppendUvarint(b, uint64(m.sent))
		b = binary.AppendUvarint(b, uint64(m.received))
		b = appendDone(b, m.done)
	case kindDecision:
		b = appendDone(b, m.done)
	}
	return b
}

func appendDone(b []byte, done []int) []byte {
	b = binary.AppendUvarint(b, uint64(len(done)))
	for _, d := range done {
		b = binary.AppendUvarint(b, uint64(d))
	}
	return b
}

var errTruncated = errors.New("truncated")

// reader walks a payload; the first failure sticks.
type reader struct {
	b   []byte
	err error
}

func (r *reader) uvarint(what string, limit uint64) uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n == 0 {
		r.err = fmt.Errorf("%s: %w", what, errTruncated)
		return 0
	}
	if n < 0 {
		r.err = fmt.Errorf("%s: varint overflows 64 bits", what)
		return 0
	}
	r.b = r.b[n:]
	if v > limit {
		r.err = fmt.Errorf("%s %d out of range (at most %d)", what, v, limit)
		return 0
	}
	return v
}

func (r *reader) done() []int {
	n := r.uvarint("done count", maxDoneWire)
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)) { // every value takes at least one byte
		r.err = fmt.Errorf("done count %d: %w", n, errTruncated)
		return nil
	}
	done := make([]int, 0, n)
	for i := uint64(0); i < n; i++ {
		v := int(r.uvarint("done value", math.MaxInt32))
		if r.err != nil {
			return nil
		}
		if len(done) > 0 && v <= done[len(done)-1] {
			r.err = fmt.Errorf("done values not strictly increasing (%d after %d)", v, done[len(done)-1])
			return nil
		}
		done = append(done, v)
	}
	return done
}

// decode parses a control message; every byte must be used.
func decode(b []byte) (message, error) {
	if len(b) < 2 {
		return message{}, fmt.Errorf("control message of %d bytes: %w", len(b), errTruncated)
	}
	if b[0] != wireVersion {
		return message{}, fmt.Errorf("control message version %d, this process speaks %d", b[0], wireVersion)
	}
	m := message{kind: b[1]}
	r := &reader{b: b[2:]}
	m.key.epoch = int64(r.uvarint("epoch", math.MaxInt64))
	m.key.phase = int(r.uvarint("phase", math.MaxInt32))
	switch m.kind {
	case kindProbe, kindReply:
		m.wave = int(r.uvarint("wave", math.MaxInt))
		if r.err == nil && m.wave < 1 {
			r.err = errors.New("wave 0 (waves count from 1)")
		}
		if m.kind == kindReply {
			m.sent = int64(r.uvarint("sent", math.MaxInt64))
			m.received = int64(r.uvarint("received", math.MaxInt64))
			m.done = r.done()
		}
	case kindDecision:
		m.done = r.done()
	default:
		return message{}, fmt.Errorf("control message of unknown kind %d", m.kind)
	}
	if r.err == nil && len(r.b) > 0 {
		r.err = fmt.Errorf("%d trailing bytes", len(r.b))
	}
	if r.err != nil {
		return message{}, fmt.Errorf("%s message: %w", kindName(m.kind), r.err)
	}
	return m, nil
}
